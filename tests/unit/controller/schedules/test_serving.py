"""One pass over a schedule, against the emulator, with a fake clock: what is created, cancelled,
recorded, and that a repeated pass (the same process, or a restarted one) never creates a second run."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from agentrun.controller.schedules.control import ScheduleController
from agentrun.controller.schedules.serving import ScheduleServer
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from tests.support.waiting import until

NAMESPACE = "default"


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


async def create_schedule(kube: KubeClient, name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentSchedule",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"agentRef": {"name": "agent"}, "task": "at {{scheduledTime}}", **spec},
    }
    created: dict[str, Any] = await kube._custom.create_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", NAMESPACE, "agentschedules", body
    )
    return created


async def read_schedule(kube: KubeClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await kube._custom.get_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", NAMESPACE, "agentschedules", name
    )
    return found


async def run_names(kube: KubeClient) -> list[str]:
    listing = await kube.list_runs(NAMESPACE, label_selector="agentrun.dev/schedule")
    return sorted(item["metadata"]["name"] for item in listing["items"])


def created_at(schedule: dict[str, Any]) -> dt.datetime:
    return dt.datetime.fromisoformat(schedule["metadata"]["creationTimestamp"])


def server(kube: KubeClient, clock: Callable[[], dt.datetime]) -> ScheduleServer:
    return ScheduleServer(kube, Metrics(CollectorRegistry()), instance="test-replica", clock=clock)


async def test_a_pass_after_the_due_time_creates_the_run_and_records_the_time(kube: KubeClient) -> None:
    schedule = await create_schedule(kube, "hourly", schedule="0 * * * *", runSpec={"priority": 3})
    due = created_at(schedule).replace(minute=0, second=0) + dt.timedelta(hours=1)
    clock = Clock(due + dt.timedelta(seconds=1))
    next_time = await server(kube, clock).serve(schedule)
    assert next_time == due + dt.timedelta(hours=1)
    name = f"hourly-{int(due.timestamp()) // 60}"
    assert await run_names(kube) == [name]
    run = await kube.get_run(NAMESPACE, name)
    assert run["spec"] == {
        "agentRef": {"name": "agent"},
        "task": f"at {due:%Y-%m-%dT%H:%M:%SZ}",
        "priority": 3,
    }
    status = (await read_schedule(kube, "hourly"))["status"]
    assert status["lastScheduleTime"] == f"{due:%Y-%m-%dT%H:%M:%SZ}"
    assert status["active"] == [{"name": name, "uid": run["metadata"]["uid"]}]


async def test_a_repeated_pass_on_a_stale_body_creates_no_second_run_in_this_process_or_a_restarted_one(
    kube: KubeClient,
) -> None:
    schedule = await create_schedule(kube, "every", schedule="* * * * *")
    clock = Clock(created_at(schedule).replace(second=0) + dt.timedelta(minutes=1, seconds=5))
    first = server(kube, clock)
    await first.serve(schedule)
    await first.serve(schedule)  # the watch event of the status write has not arrived yet
    # A restarted process with the body from before the write (as if killed before it was written).
    await server(kube, clock).serve(schedule)
    assert len(await run_names(kube)) == 1


async def test_before_the_first_time_nothing_is_created(kube: KubeClient) -> None:
    schedule = await create_schedule(kube, "later", schedule="0 0 1 1 *")
    await server(kube, Clock(created_at(schedule) + dt.timedelta(minutes=5))).serve(schedule)
    assert await run_names(kube) == []
    status = (await read_schedule(kube, "later"))["status"]
    assert "lastScheduleTime" not in status and status["nextScheduleTime"].endswith("-01-01T00:00:00Z")


async def test_replace_cancels_the_active_run_before_creating_the_next(kube: KubeClient) -> None:
    schedule = await create_schedule(kube, "swap", schedule="* * * * *", concurrencyPolicy="Replace")
    clock = Clock(created_at(schedule).replace(second=0) + dt.timedelta(minutes=1, seconds=5))
    serving = server(kube, clock)
    await serving.serve(schedule)
    (first,) = await run_names(kube)
    clock.now += dt.timedelta(minutes=1)
    await serving.serve(await read_schedule(kube, "swap"))
    names = await run_names(kube)
    assert len(names) == 2 and first in names
    assert (await kube.get_run(NAMESPACE, first))["spec"]["cancel"] is True


async def test_forbid_skips_while_the_run_is_active(kube: KubeClient) -> None:
    schedule = await create_schedule(kube, "one", schedule="* * * * *", concurrencyPolicy="Forbid")
    clock = Clock(created_at(schedule).replace(second=0) + dt.timedelta(minutes=1, seconds=5))
    serving = server(kube, clock)
    await serving.serve(schedule)
    clock.now += dt.timedelta(minutes=1)
    await serving.serve(await read_schedule(kube, "one"))
    assert len(await run_names(kube)) == 1
    status = (await read_schedule(kube, "one"))["status"]
    assert status["lastScheduleTime"] == f"{clock.now.replace(second=0):%Y-%m-%dT%H:%M:%SZ}"


class Owning:
    """Ownership that a test switches: owns nothing until told."""

    def __init__(self) -> None:
        self.mine = False
        self.listeners: list[Callable[[], None]] = []

    def owns(self, uid: str) -> bool:
        return self.mine

    def subscribe(self, changed: Callable[[], None]) -> None:
        self.listeners.append(changed)

    @property
    def fenced(self) -> bool:
        return False


async def test_only_the_owner_of_the_schedule_serves_it(kube: KubeClient) -> None:
    schedule = await create_schedule(kube, "owned", schedule="* * * * *")
    clock = Clock(created_at(schedule).replace(second=0) + dt.timedelta(minutes=1, seconds=5))
    ownership = Owning()
    controller = ScheduleController(
        kube, Metrics(CollectorRegistry()), ownership, instance="test-replica", clock=clock
    )
    try:
        controller.observe(None, schedule)
        await asyncio.sleep(0.3)
        assert await run_names(kube) == []
        ownership.mine = True
        for changed in ownership.listeners:
            changed()
        assert len(await until(lambda: run_names(kube), "the run the schedule owes")) == 1
    finally:
        await controller.close()
