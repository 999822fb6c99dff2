"""Object bookkeeping of the emulated API server: metadata, versions, generations, status isolation."""

from __future__ import annotations

import asyncio
import io
import json
import re
import uuid

import aiohttp

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import CONFIGMAPS, WIDGETS, widget


async def test_create_assigns_uid_timestamp_version_generation_and_namespace_from_url(
    client: KubeClient,
) -> None:
    answer = await client.post(WIDGETS, widget("w1"))
    assert answer.status == 201
    meta = answer.body["metadata"]
    uuid.UUID(meta["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["namespace"] == "default"
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    fetched = await client.get(f"{WIDGETS}/w1")
    assert fetched.body == answer.body


async def test_generate_name_gets_a_random_suffix_returned_in_the_response(client: KubeClient) -> None:
    first = await client.post(WIDGETS, widget(generate_name="run-"))
    second = await client.post(WIDGETS, widget(generate_name="run-"))
    names = [first.body["metadata"]["name"], second.body["metadata"]["name"]]
    assert all(re.fullmatch(r"run-[a-z0-9]{5}", name) for name in names)
    assert names[0] != names[1]
    assert (await client.get(f"{WIDGETS}/{names[0]}")).status == 200


async def test_create_without_name_or_generate_name_is_rejected_with_422(client: KubeClient) -> None:
    answer = await client.post(WIDGETS, widget())
    assert answer.status == 422
    assert answer.body["details"]["causes"][0]["field"] == "metadata.name"


async def test_create_with_a_namespace_different_from_the_url_is_a_bad_request(client: KubeClient) -> None:
    body = widget("w1")
    body["metadata"]["namespace"] = "other"  # type: ignore[index]
    assert (await client.post(WIDGETS, body)).status == 400


async def test_create_in_a_missing_namespace_is_not_found(client: KubeClient) -> None:
    answer = await client.post("/api/v1/namespaces/nowhere/configmaps", {"metadata": {"name": "c"}})
    assert answer.status == 404
    assert answer.body["message"] == 'namespaces "nowhere" not found'


async def test_posting_an_existing_name_is_a_409_already_exists(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    answer = await client.post(WIDGETS, widget("w1"))
    assert answer.status == 409
    assert answer.body["reason"] == "AlreadyExists"
    assert answer.body["message"] == 'widgets.test.agentrun.dev "w1" already exists'


async def test_resource_version_grows_on_every_write_and_lists_carry_the_current_one(
    client: KubeClient,
) -> None:
    created = await client.post(CONFIGMAPS, {"metadata": {"name": "c1"}, "data": {"a": "1"}})
    patched = await client.patch(f"{CONFIGMAPS}/c1", {"data": {"a": "2"}})
    other = await client.post(CONFIGMAPS, {"metadata": {"name": "c2"}})
    assert int(created.rv) < int(patched.rv) < int(other.rv)
    listed = await client.get(CONFIGMAPS)
    assert listed.body["kind"] == "ConfigMapList"
    assert listed.rv == other.rv
    assert [item["metadata"]["name"] for item in listed.body["items"]] == ["c1", "c2"]


async def test_a_write_that_changes_nothing_keeps_the_resource_version(client: KubeClient) -> None:
    created = await client.post(WIDGETS, widget("w1", size=4))
    again = await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 4}})
    assert again.status == 200
    assert again.rv == created.rv


async def test_generation_counts_spec_changes_but_not_metadata_or_status_changes(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    labelled = await client.patch(f"{WIDGETS}/w1", {"metadata": {"labels": {"team": "a"}}})
    assert labelled.body["metadata"]["generation"] == 1
    status = await client.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}})
    assert status.body["metadata"]["generation"] == 1
    resized = await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 5}})
    assert resized.body["metadata"]["generation"] == 2
    assert int(resized.rv) > int(status.rv) > int(labelled.rv)


async def test_setting_the_deletion_timestamp_bumps_the_generation(client: KubeClient) -> None:
    body = widget("w1")
    body["metadata"]["finalizers"] = ["test/hold"]  # type: ignore[index]
    await client.post(WIDGETS, body)
    deleting = await client.delete(f"{WIDGETS}/w1")
    assert deleting.body["metadata"]["generation"] == 2
    assert deleting.body["metadata"]["deletionTimestamp"]


async def test_status_in_a_create_is_dropped_when_status_is_a_subresource(client: KubeClient) -> None:
    body = widget("w1")
    body["status"] = {"phase": "Done"}
    answer = await client.post(WIDGETS, body)
    assert "status" not in answer.body


async def test_status_changes_sent_to_the_main_resource_are_ignored(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    await client.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}})
    answer = await client.patch(f"{WIDGETS}/w1", {"status": {"phase": "Hacked"}, "spec": {"size": 6}})
    assert answer.body["status"] == {"phase": "Running"}
    assert answer.body["spec"]["size"] == 6


async def test_status_subresource_writes_change_only_the_status(client: KubeClient) -> None:
    created = await client.post(WIDGETS, widget("w1"))
    answer = await client.patch(
        f"{WIDGETS}/w1/status",
        {
            "status": {"phase": "Running", "iterations": 2},
            "spec": {"size": 9},
            "metadata": {"labels": {"x": "y"}},
        },
    )
    assert answer.status == 200
    assert answer.body["status"] == {"phase": "Running", "iterations": 2}
    assert answer.body["spec"]["size"] == 3
    assert "labels" not in answer.body["metadata"]
    assert int(answer.rv) > int(created.rv)
    assert (await client.get(f"{WIDGETS}/w1/status")).body["status"]["phase"] == "Running"


async def test_put_on_the_status_subresource_replaces_the_status(client: KubeClient) -> None:
    await client.post(WIDGETS, widget("w1"))
    current = await client.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running", "iterations": 1}})
    replaced = current.body | {"status": {"phase": "Done"}}
    answer = await client.put(f"{WIDGETS}/w1/status", replaced)
    assert answer.body["status"] == {"phase": "Done"}


async def test_put_replaces_the_object_and_keeps_server_owned_metadata(client: KubeClient) -> None:
    created = await client.post(WIDGETS, widget("w1", size=4, label="abc"))
    body = widget("w1", size=5)
    body["metadata"]["resourceVersion"] = created.rv  # type: ignore[index]
    answer = await client.put(f"{WIDGETS}/w1", body)
    assert answer.status == 200
    assert "label" not in answer.body["spec"]
    assert answer.body["spec"]["size"] == 5
    assert answer.body["metadata"]["uid"] == created.body["metadata"]["uid"]
    assert answer.body["metadata"]["creationTimestamp"] == created.body["metadata"]["creationTimestamp"]


async def test_a_put_naming_another_uid_is_a_failed_precondition(client: KubeClient) -> None:
    # kube-apiserver v1.36 takes metadata.uid of a PUT as a precondition (measured with a ConfigMap).
    created = await client.post(WIDGETS, widget("w1", size=4))
    body = widget("w1", size=5)
    body["metadata"]["resourceVersion"] = created.rv  # type: ignore[index]
    body["metadata"]["uid"] = "forged"  # type: ignore[index]
    answer = await client.put(f"{WIDGETS}/w1", body)
    assert answer.status == 409 and "UID in precondition: forged" in answer.body["message"]


async def test_put_with_a_stale_resource_version_is_a_409_conflict(client: KubeClient) -> None:
    created = await client.post(WIDGETS, widget("w1"))
    await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 5}})
    body = widget("w1", size=6)
    body["metadata"]["resourceVersion"] = created.rv  # type: ignore[index]
    answer = await client.put(f"{WIDGETS}/w1", body)
    assert answer.status == 409
    assert answer.body["reason"] == "Conflict"
    assert "the object has been modified" in answer.body["message"]


async def test_put_of_a_missing_object_is_not_found(client: KubeClient) -> None:
    answer = await client.put(f"{WIDGETS}/ghost", widget("ghost"))
    assert answer.status == 404
    assert answer.body["details"] == {"name": "ghost", "group": "test.agentrun.dev", "kind": "widgets"}


async def test_get_of_a_missing_object_answers_a_not_found_status(client: KubeClient) -> None:
    answer = await client.get(f"{WIDGETS}/ghost")
    assert answer.status == 404
    assert answer.body["kind"] == "Status"
    assert answer.body["message"] == 'widgets.test.agentrun.dev "ghost" not found'


async def test_a_get_asking_for_partial_object_metadata_answers_the_metadata_without_the_data(
    client: KubeClient,
) -> None:
    """As kube-apiserver v1.36 answers it (measured): kind PartialObjectMetadata, no data."""
    secrets = "/api/v1/namespaces/default/secrets"
    await client.post(secrets, {"metadata": {"name": "token"}, "data": {"t": "c2VjcmV0"}})
    accept = {"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}
    answer = await client.get(f"{secrets}/token", headers=accept)
    assert answer.status == 200
    assert set(answer.body) == {"kind", "apiVersion", "metadata"}
    assert (answer.body["kind"], answer.body["apiVersion"]) == ("PartialObjectMetadata", "meta.k8s.io/v1")
    assert answer.body["metadata"]["name"] == "token"
    assert (await client.get(f"{secrets}/absent", headers=accept)).status == 404


async def test_objects_are_served_under_every_version_with_that_version_in_api_version(
    client: KubeClient,
) -> None:
    await client.post(WIDGETS, widget("w1"))
    beta = await client.get("/apis/test.agentrun.dev/v1beta1/namespaces/default/widgets/w1")
    assert beta.body["apiVersion"] == "test.agentrun.dev/v1beta1"
    assert beta.body["spec"]["task"] == "build"


async def test_label_values_that_the_server_would_refuse_are_rejected_with_422(client: KubeClient) -> None:
    answer = await client.post(CONFIGMAPS, {"metadata": {"name": "c1", "labels": {"run": "a/b"}}})
    assert answer.status == 422
    assert answer.body["details"]["causes"][0]["field"] == "metadata.labels"


async def test_dry_run_creates_nothing(client: KubeClient) -> None:
    answer = await client.post(CONFIGMAPS, {"metadata": {"name": "c1"}}, params={"dryRun": "All"})
    assert answer.status == 201
    assert (await client.get(f"{CONFIGMAPS}/c1")).status == 404


async def test_objects_and_their_history_are_visible_through_kmock_objects(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    await client.post(WIDGETS, widget("w1"))
    await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 7}})
    stored = kube.emulator.objects["test.agentrun.dev/v1/widgets", "default", "w1"]
    assert stored >= {"spec": {"size": 7}}
    assert len(stored.history) == 2
    assert kube.emulator.get_object("widgets", "default", "w1") == dict(stored)


async def test_concurrent_writers_get_unique_increasing_resource_versions(client: KubeClient) -> None:
    created = await asyncio.gather(
        *(client.post(CONFIGMAPS, {"metadata": {"name": f"c{i}"}}) for i in range(50))
    )
    patched = await asyncio.gather(
        *(client.patch(f"{CONFIGMAPS}/c{i}", {"data": {"n": str(i)}}) for i in range(50))
    )
    versions = [int(answer.rv) for answer in created + patched]
    assert len(set(versions)) == 100
    assert all(int(p.rv) > int(c.rv) for c, p in zip(created, patched, strict=True))


async def test_bodies_up_to_three_mebibytes_are_read_and_larger_ones_get_413(kube: EmulatedCluster) -> None:
    async def post(size: int) -> tuple[int, dict[str, object]]:
        manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"big-{size}"}}
        manifest["data"] = {"blob": "x" * size}
        body = io.BytesIO(json.dumps(manifest).encode())
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{kube.url}{CONFIGMAPS}", data=body, headers={"Content-Type": "application/json"}
            ) as response,
        ):
            return response.status, await response.json()

    status, answer = await post(2 * 1024 * 1024)
    assert status == 201, answer
    status, answer = await post(3 * 1024 * 1024 + 1)
    assert (status, answer["reason"], answer["code"]) == (413, "RequestEntityTooLarge", 413)


async def test_a_network_policy_with_no_rules_is_stored_without_the_empty_lists(client: KubeClient) -> None:
    """Measured on kube-apiserver v1.36: ingress and egress are omitempty, a deny-all policy has neither."""
    path = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-all"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
    }
    created = await client.post(path, policy)
    assert created.status == 201
    stored = (await client.get(f"{path}/deny-all")).body["spec"]
    assert stored == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
