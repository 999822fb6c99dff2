"""The operator's own AgentRun watch (controller/agentruns/watching.py) against the API emulator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from kubernetes_asyncio import client

from agentrun.controller.agentruns import watching
from agentrun.controller.agentruns.watching import LEGACY_FINALIZER, RunWatch
from agentrun.kube.calling import KubeClient
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.builders import agentrun
from tests.support.waiting import until


class Seen:
    """What the watch delivered: (type, name, resourceVersion), in order."""

    def __init__(self, *, failing: str | None = None) -> None:
        self.events: list[tuple[str | None, str, str]] = []
        self.bodies: dict[str, Mapping[str, Any]] = {}
        self._failing = failing

    async def __call__(self, kind: str | None, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        self.events.append((kind, meta["name"], meta["resourceVersion"]))
        self.bodies[meta["name"]] = body
        if meta["name"] == self._failing:
            raise RuntimeError("the handler failed")

    def of(self, name: str) -> list[str | None]:
        return [kind for kind, each, _ in self.events if each == name]


class Pauses:
    def __init__(self) -> None:
        self.taken: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.taken.append(seconds)
        await asyncio.sleep(0)


@pytest.fixture
async def watch_of(kube: KubeClient) -> AsyncIterator[Any]:
    started: list[RunWatch] = []

    def start(seen: Seen, namespaces: tuple[str, ...] = (), pauses: Pauses | None = None) -> RunWatch:
        watch = RunWatch(kube, namespaces, seen, sleep=pauses or Pauses())
        watch.start()
        started.append(watch)
        return watch

    yield start
    for watch in started:
        await watch.stop()


async def create(kube: KubeClient, name: str, namespace: str = "default", **extra: Any) -> dict[str, Any]:
    body = agentrun(name, "count", namespace=namespace)
    body["metadata"].update(extra)
    return await kube.create_run(namespace, body)


async def test_runs_present_at_start_come_as_a_listing_then_changes_as_events_in_order(
    kube: KubeClient, watch_of: Any
) -> None:
    await create(kube, "before")
    seen = Seen()
    watch = watch_of(seen)
    await asyncio.wait_for(watch.listed.wait(), 30)
    assert seen.events[0][:2] == (None, "before")
    await create(kube, "after")
    await kube.patch_run_status("default", "after", {"phase": "Running"})
    await kube.delete_run("default", "after", (await kube.get_run("default", "after"))["metadata"]["uid"])
    await until(lambda: seen.of("after") == ["ADDED", "MODIFIED", "DELETED"], "the run's three events")
    assert seen.bodies["after"]["metadata"]["name"] == "after"


async def test_a_listing_of_many_pages_delivers_every_run_once_before_ready(
    kube: KubeClient, watch_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watching, "PAGE", 2)
    for i in range(5):
        await create(kube, f"run-{i}")
    seen = Seen()
    watch = watch_of(seen)
    await asyncio.wait_for(watch.listed.wait(), 30)
    assert sorted(name for kind, name, _ in seen.events if kind is None) == [f"run-{i}" for i in range(5)]


async def test_a_cut_stream_resumes_from_the_last_version_without_repeating_or_missing_an_event(
    cluster: KubeEmulator, kube: KubeClient, watch_of: Any
) -> None:
    cluster.emulator.faults.drop_watch(resource="agentruns", after_events=1, times=3)
    seen = Seen()
    watch = watch_of(seen)
    await asyncio.wait_for(watch.listed.wait(), 30)
    for i in range(4):
        await create(kube, f"run-{i}")
    await until(lambda: len(seen.events) >= 4, "four runs seen")
    await asyncio.sleep(0.2)  # room for a repeated event to arrive, were one coming
    assert [(kind, name) for kind, name, _ in seen.events] == [("ADDED", f"run-{i}") for i in range(4)]


async def test_an_expired_watch_lists_again_and_sees_what_changed_meanwhile(
    cluster: KubeEmulator, kube: KubeClient, watch_of: Any
) -> None:
    await create(kube, "first")
    cluster.emulator.faults.drop_watch(resource="agentruns", after_events=1, expire=True)
    seen = Seen()
    watch = watch_of(seen)
    await asyncio.wait_for(watch.listed.wait(), 30)
    await create(kube, "second")  # the stream delivers it, then expires
    await until(lambda: seen.of("first") == [None, None], "the second listing")
    assert seen.of("second")[0] == "ADDED" and None in seen.of("second")


async def test_a_refused_listing_is_retried_after_a_pause(
    cluster: KubeEmulator, kube: KubeClient, watch_of: Any
) -> None:
    await create(kube, "waiting")
    cluster.emulator.faults.add(verb="list", resource="agentruns", status=500, times=2)
    pauses = Pauses()
    seen = Seen()
    watch = watch_of(seen, pauses=pauses)
    await asyncio.wait_for(watch.listed.wait(), 30)
    assert pauses.taken == list(watching.BACKOFF[:2])
    assert seen.of("waiting") == [None]


async def test_a_failing_handler_does_not_end_the_watch(kube: KubeClient, watch_of: Any) -> None:
    seen = Seen(failing="bad")
    watch = watch_of(seen)
    await asyncio.wait_for(watch.listed.wait(), 30)
    await create(kube, "bad")
    await create(kube, "good")
    await until(lambda: seen.of("good") == ["ADDED"], "the run after the failing one")
    assert seen.of("bad") == ["ADDED"]  # delivered once, its failure logged, not retried


async def test_each_named_namespace_is_watched_and_no_other(
    kube: KubeClient, core: client.CoreV1Api, watch_of: Any
) -> None:
    for namespace in ("team-a", "team-b"):
        await core.create_namespace({"metadata": {"name": namespace}})
    seen = Seen()
    watch = watch_of(seen, ("team-a", "team-b"))
    await asyncio.wait_for(watch.listed.wait(), 30)
    await create(kube, "in-a", "team-a")
    await create(kube, "elsewhere", "default")
    await create(kube, "in-b", "team-b")
    await until(lambda: seen.of("in-b") == ["ADDED"] and seen.of("in-a") == ["ADDED"], "both namespaces")
    assert seen.of("elsewhere") == []


async def test_a_run_larger_than_a_stream_line_limit_is_delivered_whole(
    kube: KubeClient, watch_of: Any
) -> None:
    seen = Seen()
    watch = watch_of(seen)
    await asyncio.wait_for(watch.listed.wait(), 30)
    await create(kube, "big", annotations={"note": "x" * 200_000})
    await until(lambda: seen.of("big") == ["ADDED"], "the big run")
    assert len(seen.bodies["big"]["metadata"]["annotations"]["note"]) == 200_000


async def test_an_earlier_builds_finalizer_is_taken_off(kube: KubeClient, watch_of: Any) -> None:
    await create(kube, "old", finalizers=[LEGACY_FINALIZER, "example.com/keep"])
    watch_of(Seen())

    async def finalizers() -> list[str]:
        return list((await kube.get_run("default", "old"))["metadata"].get("finalizers") or [])

    await until(finalizers, "the finalizer taken off", done=lambda f: f == ["example.com/keep"])
    assert await finalizers() == ["example.com/keep"]  # only the earlier build's finalizer went


async def test_a_stream_that_ends_at_once_is_opened_again_after_a_growing_pause(
    cluster: KubeEmulator, kube: KubeClient, watch_of: Any
) -> None:
    cluster.emulator.faults.drop_watch(resource="agentruns", after_events=0, times=3)
    pauses = Pauses()
    seen = Seen()
    watch_of(seen, pauses=pauses)
    await until(lambda: len(pauses.taken) >= 3, "three pauses")
    assert pauses.taken[:3] == list(watching.BACKOFF[:3])
    await create(kube, "after")  # the fourth stream stays open
    await until(lambda: seen.of("after") == ["ADDED"], "the run seen")
