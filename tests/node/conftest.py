"""The node tier (`make e2e-node`): a real API server with a real node, the image built and imported.

`pytest --real-node tests/node` with KUBECONFIG at a cluster that has a Ready node which holds the image
``AGENTRUN_E2E_IMAGE`` (default ``localhost/agentrun-operator:dev``; ``make e2e-node`` builds it from the
Dockerfile and imports it into ../shared/tools/real-node's containerd). Each scenario installs the chart
into a namespace of its own; the fake Messages API listens where the pods reach this host
(``AGENTRUN_E2E_HOST_ADDRESS``, default the real node's bridge 10.88.0.1).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.clusters import TestCluster, cluster_for, kubectl_sync
from tests.support.node import Helm, helm_home, label_restricted


@pytest.fixture(scope="session", autouse=True)
def a_ready_node(real_kubeconfig: Path | None) -> None:
    assert real_kubeconfig is not None, "the node tier runs with --real-node"
    nodes = json.loads(kubectl_sync(real_kubeconfig, "get", "nodes", "-o", "json"))["items"]
    ready = [
        n["metadata"]["name"]
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
    ]
    if not ready:
        raise pytest.UsageError(
            "--real-node: the cluster KUBECONFIG points at has no Ready node (start one: "
            "../shared/tools/real-node/README.md, or use make e2e-kind)"
        )


@pytest.fixture
async def cluster(real_kubeconfig: Path | None) -> AsyncIterator[TestCluster]:
    """A namespace of the scenario's own, enforcing the restricted Pod Security Standard."""
    async with cluster_for(real_kubeconfig) as chosen:
        await label_restricted(chosen)
        yield chosen


@pytest.fixture
async def helm(real_kubeconfig: Path | None) -> AsyncIterator[Helm]:
    assert real_kubeconfig is not None
    async with helm_home() as home:
        yield Helm(real_kubeconfig, home)


@pytest.fixture(scope="session", autouse=True)
def controllers_a_cluster_runs(real_kubeconfig: Path | None) -> Iterator[None]:
    """The disruption, Endpoints and EndpointSlice controllers, which every cluster runs and the real
    node's recipe leaves out: without them a PodDisruptionBudget is never evaluated (every eviction
    refused) and the metrics Service has no endpoints to scrape. Started from
    ``AGENTRUN_E2E_CONTROLLER_MANAGER`` (a kube-controller-manager binary; make e2e-node passes the
    real-apiserver's) when set."""
    binary = os.environ.get("AGENTRUN_E2E_CONTROLLER_MANAGER")
    if not binary:
        yield
        return
    assert real_kubeconfig is not None
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [
                binary,
                "--kubeconfig",
                str(real_kubeconfig),
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=disruption-controller,endpoints-controller,endpointslice-controller",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(30)
