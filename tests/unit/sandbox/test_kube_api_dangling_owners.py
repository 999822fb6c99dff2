"""Garbage collection of objects written after their owner was deleted, as the real collector does."""

from __future__ import annotations

from tests.support.kube_client import KubeClient
from tests.support.kube_testing import CONFIGMAPS, WIDGETS, widget
from tests.support.waiting import until


async def test_an_object_created_with_an_owner_that_no_longer_exists_is_collected(client: KubeClient) -> None:
    owner = (await client.post(WIDGETS, widget("owner"))).body
    await client.delete(f"{WIDGETS}/owner")
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": "Widget",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    created = await client.post(CONFIGMAPS, {"metadata": {"name": "late", "ownerReferences": [ref]}})
    assert created.status == 201

    async def collected() -> bool:
        return (await client.get(f"{CONFIGMAPS}/late")).status == 404

    await until(collected, "the late dependent to be collected")


async def test_an_object_with_a_living_owner_and_a_missing_one_keeps_the_living_reference(
    client: KubeClient,
) -> None:
    alive = (await client.post(WIDGETS, widget("alive"))).body
    living = {
        "apiVersion": alive["apiVersion"],
        "kind": "Widget",
        "name": "alive",
        "uid": alive["metadata"]["uid"],
    }
    missing = {**living, "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}
    await client.post(CONFIGMAPS, {"metadata": {"name": "child", "ownerReferences": [living, missing]}})

    async def stripped() -> bool:
        refs = (await client.get(f"{CONFIGMAPS}/child")).body["metadata"].get("ownerReferences")
        return refs == [living]

    await until(stripped, "the missing owner's reference to be removed")
    # The living owner keeps its dependent: only the dangling reference went, not the object.
    kept = await client.get(f"{CONFIGMAPS}/child")
    assert kept.status == 200 and kept.body["metadata"]["ownerReferences"] == [living]
