"""PATCH content types as the real API server treats them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import CONFIGMAPS, WIDGETS, widget


@pytest.fixture
async def client(kube: EmulatedCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient(kube.url) as client:
        await client.post(WIDGETS, widget("w1", label="abc", env={"A": "1", "B": "2"}))
        yield client


async def test_merge_patch_merges_objects_and_null_deletes_keys(client: KubeClient) -> None:
    answer = await client.patch(
        f"{WIDGETS}/w1", {"spec": {"label": None, "env": {"A": None, "C": "3"}, "size": 4}}
    )
    assert answer.status == 200
    spec = answer.body["spec"]
    assert "label" not in spec
    assert spec["env"] == {"B": "2", "C": "3"}
    assert spec["size"] == 4
    assert spec["task"] == "build"


async def test_merge_patch_replaces_lists_whole(client: KubeClient) -> None:
    await client.patch(f"{WIDGETS}/w1", {"spec": {"tags": ["a", "b"]}})
    answer = await client.patch(f"{WIDGETS}/w1", {"spec": {"tags": ["c"]}})
    assert answer.body["spec"]["tags"] == ["c"]


async def test_json_patch_applies_add_replace_remove_move_copy_and_test(client: KubeClient) -> None:
    current = await client.get(f"{WIDGETS}/w1")
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": current.rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["test/one"]},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "test/two"},
        {"op": "replace", "path": "/spec/size", "value": 8},
        {"op": "remove", "path": "/spec/label"},
        {"op": "copy", "from": "/spec/env/A", "path": "/spec/env/B"},
        {"op": "move", "from": "/spec/env/A", "path": "/spec/note"},
    ]
    answer = await client.patch(f"{WIDGETS}/w1", ops, patch_type="json")
    assert answer.status == 200, answer.body
    assert answer.body["metadata"]["finalizers"] == ["test/one", "test/two"]
    assert answer.body["spec"]["size"] == 8
    assert "label" not in answer.body["spec"]
    assert answer.body["spec"]["env"] == {"B": "1"}
    assert answer.body["spec"]["note"] == "1"


async def test_failed_json_patch_test_op_is_rejected_with_422(client: KubeClient) -> None:
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "replace", "path": "/spec/size", "value": 8},
    ]
    answer = await client.patch(f"{WIDGETS}/w1", ops, patch_type="json")
    assert answer.status == 422
    assert answer.body["kind"] == "Status"
    assert answer.body["reason"] == "Invalid"
    assert answer.body["code"] == 422
    assert answer.body["message"] == "the server rejected our request due to an error in our request"
    assert (await client.get(f"{WIDGETS}/w1")).body["spec"]["size"] == 3


async def test_json_patch_on_a_missing_path_is_rejected_with_422(client: KubeClient) -> None:
    answer = await client.patch(
        f"{WIDGETS}/w1", [{"op": "remove", "path": "/spec/nothing"}], patch_type="json"
    )
    assert answer.status == 422


async def test_a_json_patch_body_that_is_not_a_list_is_a_bad_request(client: KubeClient) -> None:
    # kubernetes_asyncio sends JSON-patch by default; a dict body is then refused, as by a real server.
    answer = await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 4}}, patch_type="json")
    assert answer.status == 400


async def test_strategic_merge_patch_is_a_merge_patch_for_built_in_types(client: KubeClient) -> None:
    await client.post(CONFIGMAPS, {"metadata": {"name": "c1"}, "data": {"a": "1", "b": "2"}})
    answer = await client.patch(f"{CONFIGMAPS}/c1", {"data": {"a": None, "c": "3"}}, patch_type="strategic")
    assert answer.status == 200
    assert answer.body["data"] == {"b": "2", "c": "3"}


async def test_strategic_merge_patch_on_a_custom_resource_is_unsupported_media_type(
    client: KubeClient,
) -> None:
    answer = await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 4}}, patch_type="strategic")
    assert answer.status == 415
    assert answer.body["reason"] == "UnsupportedMediaType"


async def test_server_side_apply_is_refused_with_415(client: KubeClient) -> None:
    answer = await client.patch(f"{WIDGETS}/w1", "spec:\n  size: 4\n", patch_type="apply")
    assert answer.status == 415


async def test_a_patch_carrying_a_stale_resource_version_is_a_409_conflict(client: KubeClient) -> None:
    current = await client.get(f"{WIDGETS}/w1")
    await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 4}})
    answer = await client.patch(
        f"{WIDGETS}/w1", {"metadata": {"resourceVersion": current.rv}, "spec": {"size": 5}}
    )
    assert answer.status == 409
    assert answer.body["reason"] == "Conflict"


async def test_patching_a_missing_object_is_not_found(client: KubeClient) -> None:
    assert (await client.patch(f"{WIDGETS}/ghost", {"spec": {"size": 4}})).status == 404


async def test_a_patch_cannot_rename_the_object(client: KubeClient) -> None:
    assert (await client.patch(f"{WIDGETS}/w1", {"metadata": {"name": "w2"}})).status == 400


async def test_json_patches_on_the_status_subresource_touch_only_the_status(client: KubeClient) -> None:
    current = await client.get(f"{WIDGETS}/w1")
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": current.rv},
        {"op": "add", "path": "/status", "value": {"phase": "Running"}},
        {"op": "replace", "path": "/spec/size", "value": 9},
    ]
    answer = await client.patch(f"{WIDGETS}/w1/status", ops, patch_type="json")
    assert answer.status == 200
    assert answer.body["status"] == {"phase": "Running"}
    assert answer.body["spec"]["size"] == 3
