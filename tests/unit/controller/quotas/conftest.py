"""The emulator with the AgentRun and AgentRunQuota CRDs, a real client, and quotas to write to."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from agentrun.kube.calling import KubeClient
from agentrun_sandbox.kube import EmulatedCluster

CRDS = Path(__file__).resolve().parents[4] / "crds"

QuotaFactory = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
def served_crds() -> list[str]:
    return ["agentruns.agentrun.dev.yaml", "agentrunquotas.agentrun.dev.yaml"]


@contextlib.asynccontextmanager
async def client_of(cluster: EmulatedCluster) -> AsyncIterator[KubeClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(cluster.kubeconfig_path), client_configuration=configuration
    )
    api = client.ApiClient(configuration)
    try:
        yield KubeClient(api)
    finally:
        await api.close()


@pytest.fixture
async def kube(cluster: EmulatedCluster) -> AsyncIterator[KubeClient]:
    async with client_of(cluster) as kube:
        yield kube


@pytest.fixture
def make_quota(kube: KubeClient) -> QuotaFactory:
    async def make(name: str = "team", namespace: str = "default", **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentRunQuota",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        await kube._custom.create_namespaced_custom_object(
            "agentrun.dev", "v1alpha1", namespace, "agentrunquotas", body
        )
        return await kube.get_quota(namespace, name)

    return make
