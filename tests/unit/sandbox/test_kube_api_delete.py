"""Deletion as a real cluster does it: finalizers, garbage collection, namespace and CRD teardown."""

from __future__ import annotations

import asyncio

from tests.support.kube_client import KubeClient
from tests.support.kube_testing import CONFIGMAPS, WIDGETS, widget
from tests.support.waiting import until


async def gone(client: KubeClient, path: str) -> bool:
    return (await client.get(path)).status == 404


def owned_by(owner: dict[str, object], name: str) -> dict[str, object]:
    meta = owner["metadata"]
    assert isinstance(meta, dict)
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}
    return {"metadata": {"name": name, "ownerReferences": [ref]}, "data": {"k": "v"}}


async def test_delete_without_finalizers_removes_the_object_at_once(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    answer = await client.delete(f"{WIDGETS}/w1")
    assert answer.status == 200
    assert answer.body["metadata"]["name"] == "w1"
    assert await gone(client, f"{WIDGETS}/w1")


async def test_delete_of_a_config_map_answers_a_success_status(client: KubeClient) -> None:
    await client.post(CONFIGMAPS, {"metadata": {"name": "c1"}})
    answer = await client.delete(f"{CONFIGMAPS}/c1")
    assert answer.body["kind"] == "Status"
    assert answer.body["status"] == "Success"


async def test_finalizers_keep_a_deleted_object_until_they_are_removed(client: KubeClient) -> None:
    body = widget("w1")
    body["metadata"]["finalizers"] = ["test/hold"]  # type: ignore[index]
    await client.post(WIDGETS, body)
    marked = await client.delete(f"{WIDGETS}/w1")
    assert marked.status == 200
    assert marked.body["metadata"]["deletionTimestamp"]
    assert (await client.get(f"{WIDGETS}/w1")).status == 200
    again = await client.delete(f"{WIDGETS}/w1")
    assert again.rv == marked.rv  # a second delete changes nothing
    released = await client.patch(f"{WIDGETS}/w1", {"metadata": {"finalizers": None}})
    assert released.status == 200
    assert await gone(client, f"{WIDGETS}/w1")


async def test_no_new_finalizers_can_be_added_to_an_object_being_deleted(client: KubeClient) -> None:
    body = widget("w1")
    body["metadata"]["finalizers"] = ["test/hold"]  # type: ignore[index]
    await client.post(WIDGETS, body)
    await client.delete(f"{WIDGETS}/w1")
    answer = await client.patch(f"{WIDGETS}/w1", {"metadata": {"finalizers": ["test/hold", "test/more"]}})
    assert answer.status == 422
    assert answer.body["details"]["causes"][0]["reason"] == "FieldValueForbidden"


async def test_delete_preconditions_that_do_not_match_are_a_conflict(client: KubeClient) -> None:
    created = await client.post(WIDGETS, widget("w1"))
    await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 4}})
    answer = await client.delete(f"{WIDGETS}/w1", {"preconditions": {"resourceVersion": created.rv}})
    assert answer.status == 409
    answer = await client.delete(f"{WIDGETS}/w1", {"preconditions": {"uid": "someone-else"}})
    assert answer.status == 409
    answer = await client.delete(f"{WIDGETS}/w1", {"preconditions": {"uid": created.body["metadata"]["uid"]}})
    assert answer.status == 200


async def test_dependents_are_garbage_collected_when_their_owner_is_deleted(client: KubeClient) -> None:
    owner = (await client.post(WIDGETS, widget("w1"))).body
    await client.post(CONFIGMAPS, owned_by(owner, "child"))
    grandchild_owner = (await client.get(f"{CONFIGMAPS}/child")).body
    await client.post(CONFIGMAPS, owned_by(grandchild_owner, "grandchild"))
    await client.post(CONFIGMAPS, {"metadata": {"name": "bystander"}})
    await client.delete(f"{WIDGETS}/w1")
    await until(lambda: gone(client, f"{CONFIGMAPS}/grandchild"), f"{f'{CONFIGMAPS}/grandchild'} to be gone")
    assert await gone(client, f"{CONFIGMAPS}/child")
    assert (await client.get(f"{CONFIGMAPS}/bystander")).status == 200


async def test_garbage_collection_waits_for_the_owner_to_be_finalized(client: KubeClient) -> None:
    body = widget("w1")
    body["metadata"]["finalizers"] = ["test/hold"]  # type: ignore[index]
    owner = (await client.post(WIDGETS, body)).body
    await client.post(CONFIGMAPS, owned_by(owner, "child"))
    await client.delete(f"{WIDGETS}/w1")
    await asyncio.sleep(0.05)
    assert (await client.get(f"{CONFIGMAPS}/child")).status == 200
    await client.patch(f"{WIDGETS}/w1", {"metadata": {"finalizers": None}})
    await until(lambda: gone(client, f"{CONFIGMAPS}/child"), f"{f'{CONFIGMAPS}/child'} to be gone")


async def test_a_dependent_with_another_living_owner_survives_and_loses_the_dangling_reference(
    client: KubeClient,
) -> None:
    first = (await client.post(WIDGETS, widget("w1"))).body
    second = (await client.post(WIDGETS, widget("w2"))).body
    child = owned_by(first, "child")
    child["metadata"]["ownerReferences"] += owned_by(second, "x")["metadata"]["ownerReferences"]  # type: ignore[index]
    await client.post(CONFIGMAPS, child)
    await client.delete(f"{WIDGETS}/w1")

    async def reference_dropped() -> bool:
        refs = (await client.get(f"{CONFIGMAPS}/child")).body["metadata"]["ownerReferences"]
        return [r["name"] for r in refs] == ["w2"]

    await until(reference_dropped, "the owner reference to be dropped")
    assert (await client.get(f"{CONFIGMAPS}/child")).status == 200


async def test_orphan_propagation_keeps_dependents_and_strips_their_owner_references(
    client: KubeClient,
) -> None:
    owner = (await client.post(WIDGETS, widget("w1"))).body
    await client.post(CONFIGMAPS, owned_by(owner, "child"))
    await client.delete(f"{WIDGETS}/w1", {"propagationPolicy": "Orphan"})
    await asyncio.sleep(0.05)
    child = await client.get(f"{CONFIGMAPS}/child")
    assert child.status == 200
    assert "ownerReferences" not in child.body["metadata"]


async def test_deleting_a_namespace_deletes_its_content_then_the_namespace(client: KubeClient) -> None:
    await client.post("/api/v1/namespaces", {"metadata": {"name": "team"}})
    team_widgets = "/apis/test.agentrun.dev/v1/namespaces/team/widgets"
    held = widget("held")
    held["metadata"]["finalizers"] = ["test/hold"]  # type: ignore[index]
    await client.post(team_widgets, held)
    await client.post(team_widgets, widget("free"))
    answer = await client.delete("/api/v1/namespaces/team")
    assert answer.body["status"]["phase"] == "Terminating"
    await until(lambda: gone(client, f"{team_widgets}/free"), f"{f'{team_widgets}/free'} to be gone")
    refused = await client.post("/api/v1/namespaces/team/configmaps", {"metadata": {"name": "late"}})
    assert refused.status == 403
    assert "because it is being terminated" in refused.body["message"]
    assert (await client.get("/api/v1/namespaces/team")).status == 200  # held by the finalized widget
    await client.patch(f"{team_widgets}/held", {"metadata": {"finalizers": None}})
    await until(lambda: gone(client, "/api/v1/namespaces/team"), f"{'/api/v1/namespaces/team'} to be gone")


async def test_deleting_a_crd_deletes_its_objects_then_stops_serving_the_resource(client: KubeClient) -> None:
    held = widget("held")
    held["metadata"]["finalizers"] = ["test/hold"]  # type: ignore[index]
    await client.post(WIDGETS, held)
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.test.agentrun.dev"
    deleting = await client.delete(crd_path)
    assert deleting.body["metadata"]["deletionTimestamp"]
    await asyncio.sleep(0.05)
    assert (await client.get(crd_path)).status == 200  # blocked by the widget's finalizer
    assert (await client.get(f"{WIDGETS}/held")).body["metadata"]["deletionTimestamp"]
    await client.patch(f"{WIDGETS}/held", {"metadata": {"finalizers": None}})
    await until(lambda: gone(client, crd_path), f"{crd_path} to be gone")
    assert (await client.get(WIDGETS)).status == 404
    assert (await client.get("/apis/test.agentrun.dev/v1")).status == 404


async def test_deletecollection_deletes_what_the_selector_selects(client: KubeClient) -> None:
    await client.post(CONFIGMAPS, {"metadata": {"name": "a", "labels": {"app": "x"}}})
    await client.post(CONFIGMAPS, {"metadata": {"name": "b", "labels": {"app": "y"}}})
    answer = await client.delete(CONFIGMAPS, params={"labelSelector": "app=x"})
    assert answer.status == 200
    assert [i["metadata"]["name"] for i in (await client.get(CONFIGMAPS)).body["items"]] == ["b"]
