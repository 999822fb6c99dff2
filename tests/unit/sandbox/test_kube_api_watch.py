"""Lists and watches: selectors, resource versions, history, timeouts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from agentrun_sandbox.kube import EmulatedCluster, KubeEmulator
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import ALL_WIDGETS, CONFIGMAPS, WIDGETS, WIDGETS_CRD, widget
from tests.support.waiting import until


@pytest.fixture
async def kube() -> AsyncIterator[EmulatedCluster]:
    async with EmulatedCluster.running(
        crd_paths=[WIDGETS_CRD], emulator=KubeEmulator(watch_history_limit=20)
    ) as kube:
        yield kube


async def make_config_maps(client: KubeClient) -> None:
    for name, labels in [
        ("a", {"app": "web", "tier": "front"}),
        ("b", {"app": "web", "tier": "back"}),
        ("c", {"app": "db"}),
        ("d", {}),
    ]:
        await client.post(CONFIGMAPS, {"metadata": {"name": name, "labels": labels}})


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=web", ["a", "b"]),
        ("app==web", ["a", "b"]),
        ("app!=web", ["c", "d"]),
        ("app in (web, db)", ["a", "b", "c"]),
        ("app notin (web)", ["c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("app=web,tier in (back)", ["b"]),
    ],
)
async def test_label_selectors_filter_lists(client: KubeClient, selector: str, names: list[str]) -> None:
    await make_config_maps(client)
    answer = await client.get(CONFIGMAPS, params={"labelSelector": selector})
    assert [item["metadata"]["name"] for item in answer.body["items"]] == names


async def test_an_unparsable_label_selector_is_a_bad_request(client: KubeClient) -> None:
    assert (await client.get(CONFIGMAPS, params={"labelSelector": "app in web"})).status == 400


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("metadata.name=b", ["b"]),
        ("metadata.name==b", ["b"]),
        ("metadata.name!=b", ["a", "c", "d"]),
        ("metadata.namespace=default,metadata.name!=a", ["b", "c", "d"]),
        ("metadata.namespace=other", []),
    ],
)
async def test_field_selectors_filter_lists(client: KubeClient, selector: str, names: list[str]) -> None:
    await make_config_maps(client)
    answer = await client.get(CONFIGMAPS, params={"fieldSelector": selector})
    assert [item["metadata"]["name"] for item in answer.body["items"]] == names


async def test_custom_resources_accept_only_metadata_and_selectable_fields_in_field_selectors(
    client: KubeClient,
) -> None:
    await client.post(WIDGETS, widget("w1", mode="slow"))
    await client.post(WIDGETS, widget("w2"))
    selected = await client.get(ALL_WIDGETS, params={"fieldSelector": "spec.mode=slow"})
    assert [item["metadata"]["name"] for item in selected.body["items"]] == ["w1"]
    refused = await client.get(ALL_WIDGETS, params={"fieldSelector": "spec.task=build"})
    assert refused.status == 400
    assert refused.body["message"] == "field label not supported: spec.task"


async def test_lists_page_with_limit_and_continue(client: KubeClient) -> None:
    await make_config_maps(client)
    first = await client.get(CONFIGMAPS, params={"limit": "3"})
    assert [i["metadata"]["name"] for i in first.body["items"]] == ["a", "b", "c"]
    assert first.body["metadata"]["remainingItemCount"] == 1
    second = await client.get(
        CONFIGMAPS, params={"limit": "3", "continue": first.body["metadata"]["continue"]}
    )
    assert [i["metadata"]["name"] for i in second.body["items"]] == ["d"]
    assert "continue" not in second.body["metadata"]


async def test_a_watch_without_resource_version_starts_with_the_current_objects(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    stream = await client.watch(WIDGETS)
    first = await stream.next()
    assert first is not None
    assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "w1")
    await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 5}})
    await client.delete(f"{WIDGETS}/w1")
    events = await stream.take(2)
    assert [(e["type"], e["object"]["spec"]["size"]) for e in events] == [("MODIFIED", 5), ("DELETED", 5)]


async def test_a_watch_from_a_resource_version_streams_only_newer_events(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    listed = await client.get(WIDGETS)
    await client.post(WIDGETS, widget("w2"))
    await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 5}})
    stream = await client.watch(WIDGETS, {"resourceVersion": listed.rv})
    events = await stream.take(2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "w2"),
        ("MODIFIED", "w1"),
    ]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(listed.rv)


async def test_a_watch_from_a_compacted_resource_version_gets_410_expired(client: KubeClient) -> None:
    first = await client.post(CONFIGMAPS, {"metadata": {"name": "c0"}})
    for index in range(25):
        await client.patch(f"{CONFIGMAPS}/c0", {"data": {"n": str(index)}})
    stream = await client.watch(CONFIGMAPS, {"resourceVersion": first.rv})
    event = await stream.next()
    assert event is not None
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"
    assert await stream.next() is None


async def test_watch_selectors_turn_objects_leaving_the_selection_into_deleted_events(
    client: KubeClient,
) -> None:
    stream = await client.watch(CONFIGMAPS, {"labelSelector": "app=web"})
    await client.post(CONFIGMAPS, {"metadata": {"name": "c1", "labels": {"app": "db"}}})
    await client.patch(f"{CONFIGMAPS}/c1", {"metadata": {"labels": {"app": "web"}}})
    await client.patch(f"{CONFIGMAPS}/c1", {"data": {"x": "1"}})
    await client.patch(f"{CONFIGMAPS}/c1", {"metadata": {"labels": {"app": "db"}}})
    events = await stream.take(3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]


async def test_watch_field_selectors_on_a_name_follow_a_single_object(client: KubeClient) -> None:
    stream = await client.watch(CONFIGMAPS, {"fieldSelector": "metadata.name=c2"})
    await client.post(CONFIGMAPS, {"metadata": {"name": "c1"}})
    await client.post(CONFIGMAPS, {"metadata": {"name": "c2"}})
    event = await stream.next()
    assert event is not None
    assert event["object"]["metadata"]["name"] == "c2"


async def test_a_cluster_wide_watch_sees_all_namespaces(client: KubeClient) -> None:
    await client.post("/api/v1/namespaces", {"metadata": {"name": "team"}})
    stream = await client.watch(ALL_WIDGETS)
    await client.post(WIDGETS, widget("w1"))
    await client.post("/apis/test.agentrun.dev/v1/namespaces/team/widgets", widget("w2"))
    events = await stream.take(2)
    assert [e["object"]["metadata"]["namespace"] for e in events] == ["default", "team"]


async def test_a_watch_ends_after_timeout_seconds(client: KubeClient) -> None:
    started = time.monotonic()
    stream = await client.watch(CONFIGMAPS, {"timeoutSeconds": "1", "resourceVersion": "1"})
    assert await stream.rest() == []
    assert 0.9 <= time.monotonic() - started < 3


async def test_send_initial_events_ends_the_initial_state_with_a_bookmark(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    stream = await client.watch(
        WIDGETS,
        {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"},
    )
    added, bookmark = await stream.take(2)
    assert added["type"] == "ADDED"
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_many_watchers_each_get_every_event(client: KubeClient) -> None:
    streams = [await client.watch(CONFIGMAPS, {"resourceVersion": "1"}) for _ in range(20)]
    await asyncio.gather(*(client.post(CONFIGMAPS, {"metadata": {"name": f"c{i}"}}) for i in range(10)))
    for stream in streams:
        names = {e["object"]["metadata"]["name"] for e in await stream.take(10)}
        assert names == {f"c{i}" for i in range(10)}


async def test_closing_the_client_side_of_a_watch_releases_the_server_side(kube: EmulatedCluster) -> None:
    async with KubeClient(kube.url) as client:
        await client.watch(CONFIGMAPS, {"resourceVersion": "1"})
        assert kube.emulator.open_watches == 1

    async def released() -> bool:
        return kube.emulator.open_watches == 0

    await until(released, "the watcher to be released")
