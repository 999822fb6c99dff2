"""Status writes through the real kubernetes_asyncio client: phases at once, progress coalesced."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from kubernetes_asyncio import client

from agentrun.api.status import AgentRunStatus
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress, TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.controller.agentruns.status_writing import StatusWriter
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIForbiddenError
from agentrun.kube.retrying import KubeRetryPolicy
from agentrun.loop.events import ApprovalDecided, ApprovalRequested, Checkpoint, RunFinished, RunStarted
from agentrun.settings import Settings
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.builders import agentrun
from tests.support.waiting import until

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
    api_client: client.ApiClient, interval: float, clock: Callable[[], float], **options: Any
) -> tuple[StatusWriter, Any]:
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentruns", agentrun(NAME, "count")
    )
    left = options.pop("status", None)
    if left:  # what an earlier owner of the run left in its status
        await KubeClient(api_client).patch_run_status("default", NAME, left)
    writer = StatusWriter(
        KubeClient(api_client),
        namespace="default",
        name=NAME,
        progress_interval=interval,
        clock=clock,
        status=AgentRunStatus.model_validate(left or {}),
        **{"stopping": lambda: False, "generation": 1, **options},
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


async def patches_reach(cluster: KubeEmulator, count: int) -> None:
    """Progress goes out in the background: wait for the count, and see it does not go past it."""
    await until(lambda: status_patches(cluster) >= count, f"{count} status patches")
    assert status_patches(cluster) == count


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
    await patches_reach(cluster, 2)
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


def resumed_status(iterations: int, generation: int = 1) -> dict[str, Any]:
    """What a replica that died mid-run left in status: Running since startTime, counts as of then."""
    return {
        "phase": "Running",
        "startTime": "2026-11-24T10:00:00Z",
        "iterations": iterations,
        "toolCalls": iterations,
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "Running",
                "message": f"iteration {iterations} done",
                "lastTransitionTime": "2026-11-24T10:00:00Z",
                "observedGeneration": generation,
            }
        ],
    }


async def test_a_run_resumed_in_the_running_phase_writes_nothing_to_say_so_again(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    writer, status = await make_writer(api_client, 10.0, clock, status=resumed_status(2))
    before = status_patches(cluster)
    await writer.notify(RunStarted(resumed=True, progress=progress(2)))
    assert status_patches(cluster) == before
    clock.now += 1
    await writer.notify(iteration_done(3))  # no write yet to keep an interval from: written at once
    await patches_reach(cluster, before + 1)
    assert ((await status())["iterations"], (await status())["phase"]) == (3, "Running")
    await writer.close()


async def test_progress_a_resumed_runs_status_missed_is_written_without_holding_the_run_back(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    writer, status = await make_writer(api_client, 10.0, clock, status=resumed_status(1))
    before = status_patches(cluster)
    cluster.emulator.faults.add(
        verb="patch", resource="agentruns", subresource="status", status=None, delay=1.0
    )
    await writer.notify(RunStarted(resumed=True, progress=progress(3)))
    assert status_patches(cluster) == before  # the run goes on to its model request meanwhile

    async def caught_up() -> bool:
        return (await status()).get("iterations") == 3

    await until(caught_up, "the resumed run's progress written")
    assert status_patches(cluster) == before + 1
    await writer.close()


@pytest.mark.parametrize(
    ("status", "generation"),
    [
        pytest.param(resumed_status(2, generation=1), 2, id="spec-changed-while-nobody-ran-it"),
        pytest.param({**resumed_status(2), "phase": "Pending"}, 1, id="not-running"),
        pytest.param({**resumed_status(2), "queuePosition": 3}, 1, id="queue-position-to-clear"),
    ],
)
async def test_a_resumed_run_whose_status_does_not_say_running_for_its_generation_writes_it(
    cluster: KubeEmulator, api_client: client.ApiClient, status: dict[str, Any], generation: int
) -> None:
    clock = Clock()
    writer, read = await make_writer(api_client, 10.0, clock, status=status, generation=generation)
    before = status_patches(cluster)
    await writer.notify(RunStarted(resumed=True, progress=progress(2)))
    assert status_patches(cluster) == before + 1
    written = await read()
    assert written["phase"] == "Running" and "queuePosition" not in written
    assert {c["observedGeneration"] for c in written["conditions"]} == {generation}
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


async def test_a_checkpoint_inside_an_iteration_writes_nothing_and_the_next_write_shows_its_progress(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    writer, status = await make_writer(api_client, 0.0, Clock())
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    before = status_patches(cluster)
    answered = Checkpoint(
        iteration=1, new_messages=[], message_count=2, trace=None, progress=progress(1), tools_pending=True
    )
    await writer.notify(answered)  # the model answered; the tools have not run: no trace row yet
    assert status_patches(cluster) == before
    await writer.notify(
        ApprovalRequested(iteration=1, tool_use_id="toolu_1", tool_name="deploy", input={"version": "2"})
    )
    written = await status()
    assert (written["phase"], written["iterations"], written["usage"]["totalTokens"]) == (
        "AwaitingApproval",
        1,
        11,
    )
    await writer.close()


async def test_a_decision_for_a_call_not_waiting_writes_nothing_and_the_last_one_settles_the_run(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    writer, status = await make_writer(api_client, 0.0, Clock())
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    for call in ("toolu_1", "toolu_2"):
        await writer.notify(
            ApprovalRequested(iteration=1, tool_use_id=call, tool_name="deploy", input={"version": "2"})
        )

    def decided(call: str) -> ApprovalDecided:
        return ApprovalDecided(
            iteration=1,
            tool_use_id=call,
            tool_name="deploy",
            approved=True,
            by="alice",
            reason=None,
            timed_out=False,
            waited_seconds=1.0,
        )

    before = status_patches(cluster)
    await writer.notify(decided("toolu_9"))
    assert status_patches(cluster) == before
    await writer.notify(decided("toolu_1"))
    written = await status()
    assert (written["phase"], [p["toolUseId"] for p in written["pendingApprovals"]]) == (
        "AwaitingApproval",
        ["toolu_2"],
    )
    await writer.notify(decided("toolu_2"))
    written = await status()
    assert (written["phase"], written["message"], written.get("pendingApprovals")) == (
        "Running",
        "deploy (toolu_2) approved by alice",
        None,
    )
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


@pytest.mark.parametrize(("newest", "observed"), [(2, 2), (None, 1)], ids=["cancelled-at-2", "no-newer-spec"])
async def test_the_end_says_it_observed_the_generation_whose_cancel_ended_the_run(
    cluster: KubeEmulator, api_client: client.ApiClient, newest: int | None, observed: int
) -> None:
    # Otherwise kstatus (Flux) reads the Cancelled run as in progress until a later event fixes it.
    writer, status = await make_writer(api_client, 10.0, Clock(), newest_generation=lambda: newest)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    await writer.notify(RunFinished(outcome=Outcome(StopReason.CANCELLED, "cancelled"), progress=progress(0)))
    written = await status()
    assert written["phase"] == "Cancelled"
    assert written["observedGeneration"] == observed
    assert {c["observedGeneration"] for c in written["conditions"]} == {observed}
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


class FakeSleep:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_a_refused_status_write_is_retried_by_the_settings_policy_and_honours_retry_after(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    sleep = FakeSleep()
    policy = KubeRetryPolicy.from_settings(
        Settings(kube_retry_first_seconds=0.5, kube_retry_max_seconds=0.75)
    )
    writer, status = await make_writer(api_client, 10.0, Clock(), retry=policy, sleep=sleep)
    faults = cluster.emulator.faults
    faults.add(verb="patch", resource="agentruns", subresource="status", status=409, times=1)
    faults.add(verb="patch", resource="agentruns", subresource="status", status=503, times=2)
    faults.add(verb="patch", resource="agentruns", subresource="status", status=429, retry_after=3, times=1)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    assert sleep.waits == [0.5, 0.75, 0.75, 3.0]
    assert (await status())["phase"] == "Running"
    assert writer.writes == 1


async def test_a_forbidden_status_write_fails_at_once(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    sleep = FakeSleep()
    writer, _ = await make_writer(api_client, 10.0, Clock(), sleep=sleep)
    cluster.emulator.faults.add(verb="patch", resource="agentruns", subresource="status", status=403, times=1)
    with pytest.raises(APIForbiddenError):
        await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    assert sleep.waits == [] and writer.writes == 0


async def test_a_deleted_run_ends_status_writes_quietly(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    writer, _ = await make_writer(api_client, 10.0, Clock(), sleep=FakeSleep())
    cluster.emulator.delete_object("agentruns", "default", NAME)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    assert writer.gone and writer.writes == 0
    before = status_patches_tried(cluster)
    await writer.notify(RunFinished(Outcome(StopReason.END_TURN, "done"), progress(1)))
    assert status_patches_tried(cluster) == before, "nothing is sent for a run that is gone"


async def test_a_run_being_stopped_stops_retrying_its_status_write(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    stopping = False

    class StopWhileWaiting(FakeSleep):
        async def __call__(self, seconds: float) -> None:
            nonlocal stopping
            await super().__call__(seconds)
            stopping = True

    sleep = StopWhileWaiting()
    writer, status = await make_writer(api_client, 10.0, Clock(), sleep=sleep, stopping=lambda: stopping)
    cluster.emulator.faults.add(verb="patch", resource="agentruns", subresource="status", status=500, times=5)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    assert sleep.waits == [0.2] and writer.writes == 0
    assert status_patches_tried(cluster) == 1
    assert "phase" not in await status()


def status_patches_tried(cluster: KubeEmulator) -> int:
    return sum(
        1
        for r in cluster.emulator.request_log
        if r.verb == "patch" and r.resource == "agentruns" and r.subresource == "status"
    )


async def test_a_slow_progress_write_does_not_hold_the_run_back(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    writer, status = await make_writer(api_client, 10.0, clock)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    cluster.emulator.faults.add(
        verb="patch", resource="agentruns", subresource="status", status=None, delay=1.0
    )
    clock.now += 11
    await writer.notify(iteration_done(1))  # due at once, and the API server takes a second
    assert status_patches(cluster) == 1  # the loop has its answer before the patch is made
    await patches_reach(cluster, 2)
    assert (await status())["iterations"] == 1
    await writer.close()


async def test_progress_arriving_while_a_write_is_on_the_wire_is_written_after_it(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    writer, status = await make_writer(api_client, 0.2, clock)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    held = cluster.emulator.faults.add(
        verb="patch", resource="agentruns", subresource="status", status=None, delay=0.5
    )
    clock.now += 1
    await writer.notify(iteration_done(1))
    await until(lambda: held.hits == 1, "iteration 1's patch at the API server, held there")
    await writer.notify(iteration_done(2))  # arrives while iteration 1's patch is on the wire

    async def iterations() -> int:
        return int((await status()).get("iterations", 0))

    await until(lambda: iterations(), "iteration 1 written", done=lambda n: n >= 1)
    clock.now += 1  # the interval after that write is up
    await until(lambda: iterations(), "iteration 2 written after it", done=lambda n: n == 2)
    assert await iterations() == 2 and writer.writes == 3  # Running, iteration 1, iteration 2
    await writer.close()


async def test_a_progress_write_skipped_because_the_run_stops_is_not_tried_again(
    cluster: KubeEmulator, api_client: client.ApiClient
) -> None:
    clock = Clock()
    stopping = False
    writer, _ = await make_writer(api_client, 10.0, clock, stopping=lambda: stopping)
    await writer.notify(RunStarted(resumed=False, progress=progress(0)))
    cluster.emulator.faults.add(verb="patch", resource="agentruns", subresource="status", status=503)
    stopping = True  # the refused write is not retried, and nothing else is written
    clock.now += 11
    await writer.notify(iteration_done(1))
    await until(lambda: writer._flush is not None and writer._flush.done(), "the progress write given up")
    assert status_patches(cluster) == 1 and writer.writes == 1
    await writer.close()
