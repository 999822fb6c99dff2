"""One loop task per unfinished run, started and stopped from watch events, without a finalizer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.controller.agentruns.run_control import RunControl, StopCause
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.controller.agentruns.supervising import RunSupervisor
from agentrun.loop.errors import HandedOff
from tests.support.waiting import until


def run_body(
    uid: str,
    phase: str | None = None,
    *,
    status: Mapping[str, Any] = {},
    cancel: bool = False,
    **metadata: Any,
) -> RunObject:
    """The run as the handler hands it on: parsed from its watch event."""
    return RunObject.parse(
        {
            "metadata": {"uid": uid, "name": f"run-{uid}", "namespace": "default", **metadata},
            "spec": {"task": "t", **({"cancel": True} if cancel else {})},
            "status": {**status, **({"phase": phase} if phase else {})},
        }
    )


class Executions:
    """Records every start; each execution waits until released (or fails when told to)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, RunObject]] = []
        self.stopping: dict[str, Callable[[], bool]] = {}
        self.controls: dict[str, RunControl] = {}
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.failures = 0

    async def __call__(self, run: RunObject, control: RunControl) -> None:
        uid = run.uid
        self.started.append((uid, run))
        self.stopping[uid] = control.silenced
        self.controls[uid] = control
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
    supervisor.observe("MODIFIED", run_body("a", "Running", status={"startTime": "2026-11-22T00:00:00Z"}))
    await until(lambda: len(executions.started) == 3, "the third start", every=0.01)
    assert executions.started[-1][1].status.start_time == "2026-11-22T00:00:00Z"
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


class Checkpointing:
    """An execution in its loop (unless its uid is in `before_loop`): asked to yield, it goes on until
    its step is recorded (`recorded`), then stops at that checkpoint (HandedOff)."""

    def __init__(self, before_loop: frozenset[str] = frozenset()) -> None:
        self.before_loop = before_loop
        self.causes: list[StopCause | None] = []
        self.starts = 0
        self.recorded = asyncio.Event()
        self.cancelled = 0
        self.yielded = 0

    async def __call__(self, run: RunObject, control: RunControl) -> None:
        self.starts += 1
        control.looping = run.uid not in self.before_loop
        try:
            await control.checkpoint.wait()
            await self.recorded.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.causes.append(control.why())
            raise
        self.yielded += 1
        self.causes.append(control.why())
        raise HandedOff()


class FakeGrace:
    """The grace period's timer, in virtual time: it runs out only when the test says so."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.over = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self.over.wait()


async def test_a_handed_off_run_stops_at_its_checkpoint_not_mid_step_and_may_start_here_again() -> None:
    execution, grace = Checkpointing(), FakeGrace()
    supervisor = RunSupervisor(execution, sleep=grace.sleep)
    supervisor.observe(None, run_body("a"))
    await settle()
    handing = asyncio.create_task(supervisor.handoff(["a"], 30))
    await settle()
    assert not handing.done(), "the handoff returned before the run reached its checkpoint"
    assert grace.asked == [30]
    execution.recorded.set()
    await asyncio.wait_for(handing, 1)
    assert (execution.yielded, execution.cancelled) == (1, 0)
    assert execution.causes == [StopCause.HANDED_OFF]
    assert supervisor.executing() == set()
    # Not ended, unlike a run that finished: ownership that comes back starts it again.
    supervisor.observe("MODIFIED", run_body("a", "Running"))
    await settle()
    assert execution.starts == 2
    await supervisor.close()


async def test_a_run_still_mid_step_when_the_grace_runs_out_is_cancelled_where_it_is() -> None:
    execution, grace = Checkpointing(), FakeGrace()
    supervisor = RunSupervisor(execution, sleep=grace.sleep)
    supervisor.observe(None, run_body("a"))
    await settle()
    handing = asyncio.create_task(supervisor.handoff(["a"], 30))
    await settle()
    assert not handing.done() and execution.cancelled == 0
    grace.over.set()
    await asyncio.wait_for(handing, 1)
    assert (execution.yielded, execution.cancelled) == (0, 1)
    assert execution.causes == [StopCause.STOPPED], "cut off where it was, after the grace"
    assert supervisor.executing() == set()


async def test_a_run_with_nothing_under_way_and_a_zero_grace_are_stopped_at_once() -> None:
    execution, grace = Checkpointing(before_loop=frozenset({"queued"})), FakeGrace()
    supervisor = RunSupervisor(execution, sleep=grace.sleep)
    for uid in ("queued", "looping"):
        supervisor.observe(None, run_body(uid))
    await settle()
    await asyncio.wait_for(supervisor.handoff(["queued"], 30), 1)
    assert execution.cancelled == 1 and grace.asked == []
    await asyncio.wait_for(supervisor.close(0.0), 1)
    assert execution.cancelled == 2 and execution.yielded == 0
    assert execution.causes == [StopCause.HANDED_OFF, StopCause.SHUTTING_DOWN]


async def test_an_execution_that_fails_while_yielding_is_not_started_again() -> None:
    class FailsWhenAsked(Checkpointing):
        async def __call__(self, run: RunObject, control: RunControl) -> None:
            self.starts += 1
            control.looping = True
            await control.checkpoint.wait()
            raise RuntimeError("transcript unwritable")

    execution, grace = FailsWhenAsked(), FakeGrace()
    supervisor = RunSupervisor(execution, sleep=grace.sleep, first_retry_seconds=0)
    supervisor.observe(None, run_body("a"))
    await settle()
    await asyncio.wait_for(supervisor.handoff(["a"], 30), 1)
    assert execution.starts == 1 and supervisor.executing() == set()


async def test_a_cancel_in_a_watch_event_reaches_the_run_and_the_attempt_after_a_failure() -> None:
    executions = Executions()
    executions.failures = 1
    supervisor = RunSupervisor(executions, first_retry_seconds=0.01)
    supervisor.observe("ADDED", run_body("a"))
    await settle()
    supervisor.observe("MODIFIED", run_body("a", "Running", cancel=True))
    await until(lambda: len(executions.started) == 2, "the attempt after the failure", every=0.01)
    control = executions.controls["a"]
    assert control.cancel.is_set() and control.why() is StopCause.CANCELLED
    assert not control.silenced(), "a cancelled run still writes its Cancelled status"
    await supervisor.close()


async def test_a_deleted_run_is_stopped_as_such_and_writes_nothing_more() -> None:
    executions = Executions()
    supervisor = RunSupervisor(executions)
    supervisor.observe("ADDED", run_body("a"))
    await settle()
    control = executions.controls["a"]
    supervisor.observe("DELETED", run_body("a"))
    await settle()
    assert control.why() is StopCause.STOPPED and control.silenced() and not control.held()


async def test_the_control_keeps_the_newest_spec_generation_seen_whether_or_not_it_cancels() -> None:
    executions = Executions()
    supervisor = RunSupervisor(executions)
    supervisor.observe("ADDED", run_body("a", generation=1))
    supervisor.observe("MODIFIED", run_body("a", "Running", generation=2))  # a TTL added, say
    await settle()
    control = executions.controls["a"]
    assert control.generation == 2 and not control.cancel.is_set()
    supervisor.observe("MODIFIED", run_body("a", "Running", cancel=True, generation=4))
    supervisor.observe("MODIFIED", run_body("a", "Running", cancel=True, generation=3))  # a stale event
    assert control.cancel.is_set() and control.generation == 4
    executions.release.set()
    await supervisor.close()
