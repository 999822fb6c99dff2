"""AgentRunQuotas for scenarios: the CRD installed on either backend, manifests, and their status."""

from __future__ import annotations

from typing import Any

from tests.support.clusters import ROOT, RUNS_API, TestCluster

QUOTA_CRD = ROOT / "crds" / "agentrunquotas.agentrun.dev.yaml"


async def install_quota_crd(cluster: TestCluster) -> None:
    """The AgentRunQuota CRD, served before the operator starts (Kopf resolves its resources then).

    On a real server it is applied, not deleted afterwards: the CRD is shared by every test there,
    and deleting it would delete other tests' quotas.
    """
    if cluster.emulator is not None:
        cluster.emulator.load_crd(QUOTA_CRD)
        return
    code, out = await cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(QUOTA_CRD))
    assert code == 0, out
    code, out = await cluster.kubectl(
        "wait", "--for=condition=Established", "crd/agentrunquotas.agentrun.dev", "--timeout=60s"
    )
    assert code == 0, out


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
