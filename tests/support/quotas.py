"""AgentRunQuotas for scenarios: the CRD installed on either backend, manifests, and their status."""

from __future__ import annotations

import json
from typing import Any

from agentrun.stores.quota_ledgers import TABLE
from tests.support.clusters import ROOT, RUNS_API, TestCluster
from tests.support.crds import install_crd
from tests.support.postgres import PostgresServer

QUOTA_CRD = ROOT / "crds" / "agentrunquotas.agentrun.dev.yaml"


async def install_quota_crd(cluster: TestCluster) -> None:
    await install_crd(cluster, QUOTA_CRD)


def quota(name: str, *, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRunQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def quotas_path(cluster: TestCluster, name: str = "") -> str:
    base = f"{RUNS_API}/namespaces/{cluster.namespace}/agentrunquotas"
    return f"{base}/{name}" if name else base


async def create_quota(cluster: TestCluster, name: str, **spec: Any) -> None:
    await cluster.request("POST", quotas_path(cluster), json=quota(name, namespace=cluster.namespace, **spec))


async def quota_status(cluster: TestCluster, name: str) -> dict[str, Any]:
    found = await cluster.request("GET", quotas_path(cluster, name))
    status: dict[str, Any] = found.get("status") or {}
    return status


async def ledger_row(postgres: PostgresServer) -> dict[str, Any]:
    """The status the one quota ledger row holds (AGENTRUN_QUOTA_LEDGER=postgres); empty without a row."""
    rows = await postgres.query(f"SELECT status FROM {TABLE}")
    status: dict[str, Any] = json.loads(rows[0]["status"]) if rows else {}
    return status
