"""Two replicas' memberships on one API server (emulated or real): they agree on who is alive, and a
deleted Lease drops its replica at once, long before its duration could expire it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from agentrun.controller.replicas.membership import GROUP_LABEL, Membership
from agentrun.kube import kubeconfig_loading
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun.settings import Settings
from tests.support.clusters import TestCluster
from tests.support.kube_requests import until

#: Long enough that only the deletion, never expiry, can drop a replica within the test.
DURATION = 120


@pytest.fixture
async def kube(cluster: TestCluster) -> AsyncIterator[KubeClient]:
    access = await kubeconfig_loading.load(str(cluster.kubeconfig))
    kube = KubeClient(access.api_client())
    try:
        yield kube
    finally:
        await kube.close()


async def test_two_replicas_agree_on_their_group_and_a_deleted_lease_drops_its_replica(
    cluster: TestCluster, kube: KubeClient
) -> None:
    group = f"it-{uuid.uuid4().hex[:10]}"

    def member(name: str) -> Membership:
        settings = Settings(
            lease_namespace=cluster.namespace,
            replica_name=name,
            replica_group=group,
            lease_duration_seconds=DURATION,
            lease_renew_seconds=1.0,
        )
        return Membership(kube, settings, Metrics(CollectorRegistry()))

    a, b = member("op-a"), member("op-b")
    pending: set[asyncio.Task[None]] = set()

    def apply_at_once(one: Membership) -> None:
        # What the wiring does once the runs it lost stopped; here no run is executing.
        task = asyncio.get_running_loop().create_task(one.applied(one.view))
        pending.add(task)
        task.add_done_callback(pending.discard)

    a.subscribe(lambda: apply_at_once(a))
    b.subscribe(lambda: apply_at_once(b))
    loops = [asyncio.create_task(one.run()) for one in (a, b)]
    try:
        await until(lambda: a.members == b.members == ("op-a", "op-b"), "both replicas see both")
        await until(lambda: a.barrier_passed and b.barrier_passed, "both applied the view")
        uids = [str(uuid.uuid4()) for _ in range(40)]
        assert all([a.owns(uid), b.owns(uid)].count(True) == 1 for uid in uids)

        loops[1].cancel()  # b stops renewing, without leaving
        await asyncio.gather(loops[1], return_exceptions=True)
        leases = await kube.list_leases(cluster.namespace, label_selector=f"{GROUP_LABEL}={group}")
        assert sorted(lease["spec"]["holderIdentity"] for lease in leases) == ["op-a", "op-b"]
        await cluster.request(
            "DELETE", cluster.path("leases", b.lease_name, api="/apis/coordination.k8s.io/v1")
        )
        await until(lambda: a.members == ("op-a",), "a drops b once its Lease is gone")
        await until(lambda: a.barrier_passed and all(a.owns(uid) for uid in uids), "a owns every run")
    finally:
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await a.leave()
    remaining = await kube.list_leases(cluster.namespace, label_selector=f"{GROUP_LABEL}={group}")
    assert remaining == []
