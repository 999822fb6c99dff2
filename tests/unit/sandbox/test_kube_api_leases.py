"""coordination.k8s.io Leases as kube-apiserver v1.36 serves them (each answer measured on a real server)."""

from __future__ import annotations

from typing import Any

from tests.support.kube_client import KubeClient

LEASES = "/apis/coordination.k8s.io/v1/namespaces/default/leases"


def lease(name: str, *, renew: str = "2026-11-24T10:00:00.123456Z", duration: int = 15) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "labels": {"agentrun.dev/replica-group": "g"}},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": duration, "renewTime": renew},
    }


async def test_a_put_without_resource_version_is_refused(client: KubeClient) -> None:
    created = await client.post(LEASES, lease("l1"))
    body = created.body
    del body["metadata"]["resourceVersion"]
    answer = await client.put(f"{LEASES}/l1", body)
    assert answer.status == 422
    assert (
        "metadata.resourceVersion: Invalid value: 0: must be specified for an update"
        in answer.body["message"]
    )


async def test_a_put_to_a_missing_lease_creates_it(client: KubeClient) -> None:
    body = lease("l2")
    body["metadata"]["resourceVersion"] = "12345"
    answer = await client.put(f"{LEASES}/l2", body)
    assert answer.status == 201
    assert (await client.get(f"{LEASES}/l2")).body["spec"]["holderIdentity"] == "a"


async def test_a_put_of_a_deleted_lease_read_before_is_a_conflict(client: KubeClient) -> None:
    created = await client.post(LEASES, lease("l3"))
    await client.delete(f"{LEASES}/l3")
    answer = await client.put(f"{LEASES}/l3", created.body)
    assert answer.status == 409 and "Precondition failed: UID in precondition" in answer.body["message"]
    assert (await client.get(f"{LEASES}/l3")).status == 404


async def test_renew_time_needs_microseconds(client: KubeClient) -> None:
    answer = await client.post(LEASES, lease("l4", renew="2026-11-24T10:00:00Z"))
    assert answer.status == 400
    assert (
        'parsing time "2026-11-24T10:00:00Z" as "2006-01-02T15:04:05.000000Z07:00"' in answer.body["message"]
    )


async def test_a_lease_duration_must_be_positive(client: KubeClient) -> None:
    answer = await client.post(LEASES, lease("l5", duration=0))
    assert answer.status == 422
    assert "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0" in answer.body["message"]
