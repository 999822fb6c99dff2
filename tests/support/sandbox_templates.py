"""SandboxTemplates for scenarios: the CRD installed on either backend, templates made and changed."""

from __future__ import annotations

from typing import Any

from tests.support.clusters import ROOT, RUNS_API, TestCluster
from tests.support.crds import install_crd

TEMPLATE_CRD = ROOT / "crds" / "sandboxtemplates.agentrun.dev.yaml"


async def install_template_crd(cluster: TestCluster) -> None:
    await install_crd(cluster, TEMPLATE_CRD)


def templates_path(namespace: str, name: str = "") -> str:
    base = f"{RUNS_API}/namespaces/{namespace}/sandboxtemplates"
    return f"{base}/{name}" if name else base


def template(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": spec,
    }


async def create_template(cluster: TestCluster, name: str, namespace: str | None = None, **spec: Any) -> None:
    where = namespace or cluster.namespace
    await cluster.request("POST", templates_path(where), json=template(name, **spec))
