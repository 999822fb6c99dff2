"""The queue phase: a run waiting for a slot says where it stands, not too often, and a cancelled
or stopped run holds on to nothing; its status shows the position until the run starts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from agentrun.api import status_patches
from agentrun.api.crd import crd
from agentrun.api.status import AgentRunStatus
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.api.usage import TokenUsage
from agentrun.controller.agentruns import phases
from agentrun.controller.agentruns.phases import Ending
from agentrun.controller.agentruns.queueing import FairQueue, QueuedRun, Ticket
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.controller.agentruns.status_writing import StatusWriter
from agentrun.kube.calling import KubeClient
from agentrun.loop.events import RunFinished, RunStarted
from agentrun.metrics.definitions import Metrics
from tests.support.builders import agentrun
from tests.support.waiting import until


class Announcements:
    def __init__(self) -> None:
        self.said: list[tuple[float, int]] = []
        self.changed = asyncio.Event()

    async def __call__(self, position: int) -> None:
        self.said.append((time.monotonic(), position))
        self.changed.set()

    @property
    def positions(self) -> list[int]:
        return [position for _, position in self.said]


def run(namespace: str, name: str, created: str = "2026-11-24T09:00:00Z") -> QueuedRun:
    return QueuedRun(namespace, name, f"uid-{namespace}-{name}", created)


async def test_a_free_slot_is_taken_at_once_without_an_announcement() -> None:
    slots, announce = FairQueue(2), Announcements()
    ticket = await phases.queue(slots, run("a", "r"), asyncio.Event(), announce=announce, interval=0)
    assert isinstance(ticket, Ticket) and ticket.holding
    assert announce.said == []
    assert slots.busy == 1
    slots.leave(ticket)
    assert slots.busy == 0


async def test_a_queued_run_says_its_position_at_once_and_a_cancel_ends_it_without_taking_a_slot() -> None:
    slots, cancel, announce = FairQueue(1), asyncio.Event(), Announcements()
    holder = slots.enter(run("a", "holder"))
    slots.enter(run("a", "ahead", "2026-11-24T08:00:00Z"))
    queued = asyncio.create_task(phases.queue(slots, run("a", "r"), cancel, announce=announce, interval=60))
    await asyncio.wait_for(announce.changed.wait(), 5)
    assert announce.positions == [2]
    cancel.set()
    ending = await asyncio.wait_for(queued, 5)
    assert isinstance(ending, Ending) and ending.outcome.stop_reason is StopReason.CANCELLED
    assert ending.outcome.message == "spec.cancel was set while queued"
    assert slots.waiting == 1, "the cancelled run gave up its place"
    slots.leave(holder)
    slots.leave(holder)
    assert slots.busy == 1 and slots.waiting == 0, "the slot went to the run ahead, not the cancelled one"


async def test_a_waiting_run_gets_the_slot_released_for_it_and_keeps_it() -> None:
    slots, announce = FairQueue(1), Announcements()
    holder = slots.enter(run("a", "holder"))
    queued = asyncio.create_task(
        phases.queue(slots, run("b", "r"), asyncio.Event(), announce=announce, interval=60)
    )
    await asyncio.wait_for(announce.changed.wait(), 5)
    slots.leave(holder)
    ticket = await asyncio.wait_for(queued, 5)
    assert isinstance(ticket, Ticket) and ticket.holding and slots.busy == 1
    assert announce.positions == [1]


async def test_a_run_stopped_while_waiting_leaves_the_queue() -> None:
    slots, announce = FairQueue(1), Announcements()
    holder = slots.enter(run("a", "holder"))
    queued = asyncio.create_task(
        phases.queue(slots, run("a", "r"), asyncio.Event(), announce=announce, interval=60)
    )
    await asyncio.wait_for(announce.changed.wait(), 5)
    queued.cancel()
    await asyncio.gather(queued, return_exceptions=True)
    assert slots.waiting == 0
    slots.leave(holder)
    assert slots.busy == 0, "nobody left to hand the slot to"


async def test_position_changes_are_announced_at_most_once_per_interval_and_only_when_changed() -> None:
    interval = 1.0
    slots, announce = FairQueue(1), Announcements()
    holder = slots.enter(run("a", "holder"))
    ahead = [slots.enter(run("a", f"ahead{i}", f"2026-11-24T08:00:0{i}Z")) for i in range(8)]
    queued = asyncio.create_task(
        phases.queue(slots, run("a", "r"), asyncio.Event(), announce=announce, interval=interval)
    )
    await asyncio.wait_for(announce.changed.wait(), 5)
    assert announce.positions == [9]

    def release() -> None:
        slots.leave(next(t for t in [holder, *ahead] if t.holding))

    for _ in range(3):  # 9 -> 6 within one interval: one write, of the latest position
        release()
        await asyncio.sleep(0.02)
    await until(lambda: len(announce.said) == 2, "the second announcement")
    assert announce.positions == [9, 6]
    await asyncio.sleep(interval * 1.5)
    assert announce.positions == [9, 6], "nothing changed: nothing written"
    release()  # the interval has passed: written at once
    await until(lambda: len(announce.said) == 3, "the third announcement")
    assert announce.positions == [9, 6, 5]
    times = [t for t, _ in announce.said]
    assert times[1] - times[0] >= interval * 0.95
    assert times[2] - times[1] >= interval
    queued.cancel()
    await asyncio.gather(queued, return_exceptions=True)


def test_the_queued_patch_writes_only_fields_the_crd_declares() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    body = status_patches.left_queue().merged(status_patches.queued(3)).body()
    assert body == {"phase": "Pending", "queuePosition": 3}
    assert set(body) <= set(schema["properties"])
    assert status_patches.left_queue().body() == {"queuePosition": None}


async def test_status_shows_the_queue_position_while_queued_and_not_once_the_run_started(
    api_client: client.ApiClient,
) -> None:
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentruns", agentrun("q", "t")
    )

    async def status() -> dict[str, Any]:
        obj = await custom.get_namespaced_custom_object(
            "agentrun.dev", "v1alpha1", "default", "agentruns", "q"
        )
        return dict(obj.get("status") or {})

    writer = StatusWriter(
        KubeClient(api_client),
        namespace="default",
        name="q",
        generation=1,
        status=AgentRunStatus(),
        stopping=lambda: False,
    )
    slots = FairQueue(50)
    for i in range(50):
        slots.enter(run("x", f"r{i}"))
    await writer.queued(3, phases.queued_message(3, slots))
    queued = await status()
    assert (queued["phase"], queued["queuePosition"]) == ("Pending", 3)
    assert queued["message"] == "position 3 in the operator's queue (50 run slots busy)"
    ready = next(c for c in queued["conditions"] if c["type"] == "Reconciling")
    assert (ready["reason"], ready["message"]) == ("Queued", queued["message"])
    await writer.notify(RunStarted(resumed=False, progress=Progress(0, 0, TokenUsage(), None)))
    started = await status()
    assert started["phase"] == "Running" and "queuePosition" not in started


async def test_a_run_resumed_with_a_stale_position_drops_it_when_it_ends(
    api_client: client.ApiClient,
) -> None:
    custom = client.CustomObjectsApi(api_client)
    await custom.create_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentruns", agentrun("stale", "t")
    )
    await KubeClient(api_client).patch_run_status("default", "stale", {"queuePosition": 7})
    writer = StatusWriter(
        KubeClient(api_client),
        namespace="default",
        name="stale",
        generation=1,
        status=AgentRunStatus(queue_position=7),
        stopping=lambda: False,
    )
    ended = Outcome(StopReason.CANCELLED, "spec.cancel was set while queued")
    await writer.notify(RunFinished(outcome=ended, progress=Progress(0, 0, TokenUsage(), None)))
    obj = await custom.get_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentruns", "stale"
    )
    assert obj["status"]["phase"] == "Cancelled" and "queuePosition" not in obj["status"]


def test_queued_runs_are_counted_in_total_and_per_namespace() -> None:
    metrics = Metrics(CollectorRegistry())
    for namespace in ("team-a", "team-a", "team-b"):
        metrics.queue_entered(namespace)
    metrics.queue_left("team-a")
    registry = metrics.registry
    assert registry.get_sample_value("agentrun_runs_queued") == 2
    assert registry.get_sample_value("agentrun_runs_queued_by_namespace", {"namespace": "team-a"}) == 1
    assert registry.get_sample_value("agentrun_runs_queued_by_namespace", {"namespace": "team-b"}) == 1


def priority_of(spec: dict[str, Any], status: dict[str, Any] | None = None) -> int:
    return RunObject.parse(
        {"metadata": {"uid": "u"}, "spec": {"task": "t", **spec}, "status": status or {}}
    ).priority


def test_a_runs_priority_is_its_own_else_its_recorded_agents_and_a_spec_the_model_refuses_waits_with_0() -> (
    None
):
    assert priority_of({"priority": 7}) == 7
    assert priority_of({"priority": -3}) == -3
    assert priority_of({}) == 0
    from_agent = {"agentSpec": {"priority": 5}}
    assert priority_of({"agentRef": {"name": "a"}}, from_agent) == 5
    assert priority_of({"agentRef": {"name": "a"}, "priority": 1}, from_agent) == 1
    assert priority_of({"priority": 5000}) == 0  # above the CRD's bound: the run ends InvalidSpec
