"""Whether a namespace is served: `kubectl agentrun operators` reads what each operator replica
publishes on its Lease (the namespaces it serves) and says so, so a run in a namespace no operator
serves is told apart from a slow one."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.builders import agentrun
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.commands import run_command
from tests.support.kube_requests import until
from tests.support.operator_process import OperatorProcess

PLUGIN = Path(sys.executable).parent / "kubectl-agentrun"
API_KEY = "sk-ant-serving-0123456789"


@dataclass(frozen=True)
class Served:
    """An operator replica serving ``served`` only, its Lease in the test namespace."""

    operator: OperatorProcess
    served: str
    unserved: str
    group: str
    replica: str


@pytest.fixture
async def serving(cluster: TestCluster, tmp_path: Path) -> AsyncIterator[Served]:
    unserved = f"{cluster.namespace}-unserved"
    await cluster.request("POST", "/api/v1/namespaces", json={"metadata": {"name": unserved}})
    group, replica = f"s{secrets.token_hex(3)}", "serving-0"
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",  # no run is served to the end here
        "AGENTRUN_LEASE_NAMESPACE": cluster.namespace,
        "AGENTRUN_REPLICA_GROUP": group,
        "AGENTRUN_REPLICA_NAME": replica,
    }
    try:
        async with cluster.operator(tmp_path / "operator.log", env, ("--namespace", cluster.namespace)) as op:
            served = Served(op, cluster.namespace, unserved, group, replica)

            async def published() -> bool:
                leases = await cluster.request(
                    "GET", f"/apis/coordination.k8s.io/v1/namespaces/{cluster.namespace}/leases"
                )
                return any(
                    (lease["metadata"].get("annotations") or {}).get("agentrun.dev/serves")
                    == cluster.namespace
                    for lease in leases["items"]
                )

            await until(published, "the replica's Lease to say what it serves", 60)
            yield served
    finally:
        await cluster.status_of("DELETE", f"/api/v1/namespaces/{unserved}")


async def _plugin(cluster: TestCluster, *args: str) -> tuple[int, str, str]:
    code, out, err = await run_command(PLUGIN, *args, env={"KUBECONFIG": str(cluster.kubeconfig)}, timeout=60)
    assert "Traceback" not in out + err, err
    return code, out, err


async def test_operators_lists_the_replica_and_what_it_serves_and_says_the_namespace_is_served(
    cluster: TestCluster, serving: Served
) -> None:
    code, out, err = await _plugin(
        cluster, "operators", "-n", serving.served, "--operator-namespace", cluster.namespace
    )
    assert code == 0, err
    header, row, blank, verdict = out.splitlines()
    assert header.split() == ["LEASE", "NAMESPACE", "GROUP", "REPLICA", "SERVES", "RENEWED"]
    cells = row.split()
    assert cells[:4] == [cluster.namespace, serving.group, serving.replica, serving.served], out
    assert cells[-1] == "ago" and blank == "", out
    assert (
        verdict
        == f"namespace {serving.served}: served by {cluster.namespace}/{serving.group} (1 live replica)"
    )


async def test_operators_says_no_live_operator_serves_a_namespace_outside_the_operators_list(
    cluster: TestCluster, serving: Served
) -> None:
    code, out, err = await _plugin(
        cluster, "operators", "-n", serving.unserved, "--operator-namespace", cluster.namespace
    )
    assert code == 0, err
    assert out.splitlines()[-1] == (
        f"namespace {serving.unserved}: no live operator serves it; its runs get no phase until one does "
        f"(the live ones serve: {serving.served})"
    )
    code, out, err = await _plugin(
        cluster, "operators", "-n", serving.unserved, "--operator-namespace", cluster.namespace, "-o", "json"
    )
    document = json.loads(out)
    assert (document["namespace"], document["served"]) == (serving.unserved, False)
    mine = [r for r in document["replicas"] if r["group"] == serving.group]
    assert [(r["replica"], r["serves"], r["live"]) for r in mine] == [
        (serving.replica, [serving.served], True)
    ]


@pytest.mark.emulator_only(
    "reads every namespace's Leases, as a user does: on a shared real server another session's operator "
    "may serve every namespace"
)
async def test_the_transcript_of_a_run_no_operator_serves_says_so(
    cluster: TestCluster, serving: Served
) -> None:
    run = agentrun("lonely", "hello", namespace=serving.unserved, model={"name": "claude-haiku-4-5"})
    await cluster.request("POST", f"{RUNS_API}/namespaces/{serving.unserved}/agentruns", json=run)
    code, out, err = await _plugin(cluster, "transcript", "lonely", "-n", serving.unserved)
    assert code == 0, err
    assert out.splitlines() == [
        f"agentrun {serving.unserved}/lonely has no stored transcript yet",
        f"namespace {serving.unserved}: no live operator serves it; its runs get no phase until one does "
        f"(the live ones serve: {serving.served}) (kubectl agentrun operators)",
    ]
