"""The in-process Kubernetes API emulator with the AgentRun CRD, and a real kubernetes_asyncio client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from agentrun.kube.calling import KubeClient
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator

CRDS = Path(__file__).resolve().parents[3] / "crds"


@pytest.fixture
def served_crds() -> list[str]:
    """The CRDs the emulator serves, by file name in crds/: a package's conftest names more."""
    return ["agentruns.agentrun.dev.yaml"]


@pytest.fixture
async def cluster(served_crds: list[str]) -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator.running(crd_paths=[CRDS / name for name in served_crds]) as kube:
        yield kube


@pytest.fixture
async def api_client(cluster: KubeEmulator) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(cluster.kubeconfig_path), client_configuration=configuration
    )
    api = client.ApiClient(configuration)
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def kube(api_client: client.ApiClient) -> KubeClient:
    return KubeClient(api_client)
