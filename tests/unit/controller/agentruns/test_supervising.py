"""One loop task per unfinished run, started and stopped from watch events, without a finalizer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.controller.agentruns.supervising import RunSupervisor


def run_body(uid: str, phase: str | None = None, **metadata: Any) -> dict[str, Any]:
    status = {"phase": phase} if phase else {}
    return {
        "metadata": {"uid": uid, "name": f"run-{uid}", "namespace": "default", **metadata},
        "status": status,
    }


class Executions:
    """Records every start; each execution waits until released (or fails when told to)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, Mapping[str, Any]]] = []
        self.stopping: dict[str, Callable[[], bool]] = {}
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.failures = 0

    async def __call__(self, body: Mapping[str, Any], stopping: Callable[[], bool]) -> None:
        uid = body["metadata"]["uid"]
        self.started.append((uid, body))
        self.stopping[uid] = stopping
        if self.failures:
            self.failures -= 1
            raise RuntimeError("transcript unwritable")
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(uid)
            raise


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_each_unfinished_run_gets_exactly_one_task_however_many_events_arrive() -> None:
    executions = Executions()
    supervisor = RunSupervisor(executions)
    for event in (None, "ADDED", "MODIFIED", "MODIFIED"):
        supervisor.observe(event, run_body("a", "Running" if event == "MODIFIED" else None))
    supervisor.observe(None, run_body("b"))
    await settle()
    assert [uid for uid, _ in executions.started] == ["a", "b"]
    assert supervisor.running == 2
    await supervisor.close()


async def test_finished_runs_are_never_started() -> None:
    executions = Executions()
    supervisor = RunSupervisor(executions)
    for phase in ("Succeeded", "Failed", "Cancelled"):
        supervisor.observe(None, run_body(phase, phase))
    await settle()
    assert executions.started == []


async def test_a_stale_event_after_the_run_ended_does_not_start_it_again() -> None:
    executions = Executions()
    supervisor = RunSupervisor(executions)
    supervisor.observe("ADDED", run_body("a"))
    await settle()
    executions.release.set()
    await settle()
    assert supervisor.running == 0
    # Sent before our terminal status patch landed: still shows the run Running.
    supervisor.observe("MODIFIED", run_body("a", "Running"))
    await settle()
    assert len(executions.started) == 1


async def test_a_deleted_run_is_told_to_stop_and_its_task_is_cancelled() -> None:
    executions = Executions()
    supervisor = RunSupervisor(executions)
    supervisor.observe("ADDED", run_body("a"))
    supervisor.observe("ADDED", run_body("b"))
    await settle()
    supervisor.observe("DELETED", run_body("a", "Running"))
    supervisor.observe("MODIFIED", run_body("b", "Running", deletionTimestamp="2026-11-22T00:00:00Z"))
    await settle()
    assert sorted(executions.cancelled) == ["a", "b"]
    assert executions.stopping["a"]() and executions.stopping["b"]()
    assert supervisor.running == 0


async def test_a_failed_task_starts_again_after_a_backoff_from_the_newest_body() -> None:
    executions = Executions()
    executions.failures = 2
    supervisor = RunSupervisor(executions, first_retry_seconds=0.01, max_retry_seconds=0.02)
    supervisor.observe("ADDED", run_body("a"))
    await settle()
    newer = run_body("a", "Running")
    newer["status"]["startTime"] = "2026-11-22T00:00:00Z"
    supervisor.observe("MODIFIED", newer)
    for _ in range(100):
        if len(executions.started) == 3:
            break
        await asyncio.sleep(0.01)
    assert len(executions.started) == 3
    assert executions.started[-1][1]["status"]["startTime"] == "2026-11-22T00:00:00Z"
    assert supervisor.running == 1
    await supervisor.close()


async def test_a_failed_task_is_not_restarted_once_its_run_is_deleted() -> None:
    executions = Executions()
    executions.failures = 1
    supervisor = RunSupervisor(executions, first_retry_seconds=0.05)
    supervisor.observe("ADDED", run_body("a"))
    await settle()
    supervisor.observe("DELETED", run_body("a"))
    await asyncio.sleep(0.1)
    assert len(executions.started) == 1
    assert supervisor.running == 0


async def test_shutdown_stops_every_run_and_starts_no_new_one() -> None:
    executions = Executions()
    supervisor = RunSupervisor(executions)
    supervisor.observe(None, run_body("a"))
    supervisor.observe(None, run_body("b"))
    await settle()
    await supervisor.close()
    assert sorted(executions.cancelled) == ["a", "b"]
    assert all(stopping() for stopping in executions.stopping.values())
    supervisor.observe("ADDED", run_body("c"))
    await settle()
    assert [uid for uid, _ in executions.started] == ["a", "b"]
