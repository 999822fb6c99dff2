"""Status writes through the real kubernetes_asyncio client: phases at once, progress coalesced."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from kubernetes_asyncio import client

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress, TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.controller.kubeapi import KubeAPI
from agentrun.controller.status_writing import StatusWriter
from agentrun.loop.events import ApprovalRequested, Checkpoint, RunFinished, RunStarted
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.builders import agentrun

NAME = "progress"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def progress(iterations: int) -> Progress:
    return Progress(
        iterations, iterations, TokenUsage(10 * iterations, iterations), Decimal("0.001") * iterations
    )


def iteration_done(iterations: int) -> Checkpoint:
    row = TraceRow(
        iteration=iterations, stop_reason="tool_use", tool_calls=(), usage=TokenUsage(10, 1), model="m"
    )
    return Checkpoint(
        iteration=iterations,
        new_messages=[],
        message_count=2 * iterations,
        trace=row,
        progress=progress(iterations),
        tools_pending=False,
    )


async def make_writer(
    api_client: client.ApiClient, interval: float, clock: Callable[[], float]
) -> tuple[StatusWriter, Any]:
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentruns", agentrun(NAME, "count")
    )
    writer = StatusWriter(
        KubeAPI(api_client),
        namespace="default",
        name=NAME,
        generation=1,
        status={},
        stopping=lambda: False,
        progress_interval=interval,
        clock=clock,
    )

    async def status() -> dict[str, Any]:
        obj = await custom.get_namespaced_custom_object(
            "agentrun.dev", "v1alpha1", "default", "agentruns", NAME
        )
        return dict(obj.get("status") or {})

    return writer, status


def status_patches(cluster: KubeEmulator) -> int:
    return sum(
        1
        for r in cluster.emulator.request_log
        if r.verb == "patch" and r.resource == "agentruns" and r.subresource == "status" and r.status == 200
    )


async def test_iterations_within_the_interval_are_not_written_one_by_one(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    writer, status = await make_writer(api_client, 10.0, clock)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    for i in (1, 2, 3):
        clock.now += 1
        await writer.notify(iteration_done(i))
    assert status_patches(cluster) == 1
    assert (await status())["iterations"] == 0
    await writer.close()


async def test_an_iteration_after_the_interval_is_written_at_once(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    writer, status = await make_writer(api_client, 10.0, clock)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    clock.now += 1
    await writer.notify(iteration_done(1))
    clock.now += 10
    await writer.notify(iteration_done(2))
    assert status_patches(cluster) == 2
    written = await status()
    assert (written["iterations"], written["usage"]["totalTokens"], written["message"]) == (
        2,
        22,
        "iteration 2 done",
    )
    await writer.close()


async def test_deferred_progress_is_written_when_the_interval_is_up_even_if_no_iteration_ends(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    # Real time: the timer must fire by itself.
    writer, status = await make_writer(api_client, 0.2, asyncio.get_running_loop().time)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    await writer.notify(iteration_done(1))
    assert (await status())["iterations"] == 0
    for _ in range(100):
        if (await status())["iterations"] == 1:
            break
        await asyncio.sleep(0.05)
    assert (await status())["iterations"] == 1
    assert status_patches(cluster) == 2
    await writer.close()


async def test_a_phase_change_carries_the_unwritten_progress(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    writer, status = await make_writer(api_client, 10.0, clock)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    clock.now += 1
    await writer.notify(iteration_done(1))
    await writer.notify(
        ApprovalRequested(iteration=1, tool_use_id="toolu_1", tool_name="deploy", input={"version": "2"})
    )
    written = await status()
    assert (written["phase"], written["iterations"], written["toolCalls"]) == ("AwaitingApproval", 1, 1)
    await writer.close()


async def test_the_end_is_written_at_once_and_a_waiting_progress_write_never_follows_it(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    writer, status = await make_writer(api_client, 0.2, asyncio.get_running_loop().time)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    await writer.notify(iteration_done(1))
    await writer.notify(
        RunFinished(outcome=Outcome(StopReason.END_TURN, "done", result="42"), progress=progress(2))
    )
    await asyncio.sleep(0.4)  # past the moment the deferred write was due
    written = await status()
    assert (written["phase"], written["iterations"], written["result"]) == ("Succeeded", 2, "42")
    assert status_patches(cluster) == 2
    await writer.close()


async def test_interval_zero_writes_every_iteration(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    writer, status = await make_writer(api_client, 0.0, Clock())
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    for i in (1, 2, 3):
        await writer.notify(iteration_done(i))
    assert status_patches(cluster) == 4
    assert (await status())["iterations"] == 3
    await writer.close()
