"""The quota reconciler: what deleted or finished runs left in a ledger is released and charged."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry

from agentrun.controller.quotas.control import Quotas
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun.quotas.ledger import Ledger
from tests.unit.controller.quotas.conftest import QuotaFactory


async def create_run(kube: KubeClient, name: str, *, phase: str | None = None) -> str:
    body: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"task": "x"},
    }
    created = await kube._custom.create_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentruns", body
    )
    if phase is not None:
        await kube.patch_run_status("default", name, {"phase": phase})
    return str(created["metadata"]["uid"])


def holding(uid: str, name: str) -> Any:
    def change(ledger: Ledger, now: dt.datetime) -> None:
        ledger.admit(uid, name, now)
        ledger.reserve(uid, name, "r1", "gone-operator/1", 1000, Decimal("0.5"), now)

    return change


async def test_runs_that_are_gone_or_finished_are_released_and_their_reservations_charged_in_full(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 10, "tokens": 100_000})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    assert await quotas.view.quotas("default")
    waiting = await create_run(kube, "waiting")
    finished = await create_run(kube, "finished", phase="Succeeded")
    local = await create_run(kube, "here")
    for uid, name in (
        (waiting, "waiting"),
        (finished, "finished"),
        ("deleted-uid", "deleted"),
        (local, "here"),
    ):
        await quotas.write("default", "team", holding(uid, name))

    assert await quotas.collect(executing={local}) == 2
    status = (await kube.get_quota("default", "team"))["status"]
    assert sorted(entry["name"] for entry in status["admitted"]) == ["here", "waiting"]
    assert sorted(entry["name"] for entry in status["reservations"]) == ["here", "waiting"]
    assert status["lost"]["requests"] == 2 and status["lost"]["tokens"] == 2000
    assert status["used"]["tokens"] == 2000
    assert await quotas.collect(executing={local}) == 0  # once: nothing left to charge again


async def test_only_the_replica_owning_a_quota_cleans_its_ledger(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 10, "tokens": 100_000})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    [quota] = await quotas.view.quotas("default")
    quota_uid = quota["metadata"]["uid"]
    await quotas.write("default", "team", holding("deleted-uid", "deleted"))

    assert await quotas.collect(executing=set(), owns=lambda uid: uid != quota_uid) == 0
    assert [e["name"] for e in (await kube.get_quota("default", "team"))["status"]["admitted"]] == ["deleted"]
    assert await quotas.collect(executing=set(), owns=lambda uid: uid == quota_uid) == 1
    assert (await kube.get_quota("default", "team"))["status"]["admitted"] == []
