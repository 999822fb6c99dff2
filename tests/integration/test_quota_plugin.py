"""`kubectl agentrun quota` as a namespace owner runs it: the installed executable against the
scenario's API server (the emulator, or a real one with `--real-cluster`).

The quotas' status is written here through the status subresource, as the operator's ledger writer
does, so the plugin is checked against exactly the numbers the server stores.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_sandbox.kube.authz import UserInfo, service_account_groups
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.commands import run_command
from tests.support.kube_requests import until
from tests.support.quotas import install_quota_crd, quota
from tests.support.rbac import StoredRbac

BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-agentrun"

DAILY_STATUS: dict[str, Any] = {
    "observedGeneration": 1,
    "windowStart": "2026-11-23T10:00:00Z",
    "used": {"concurrentRuns": 2, "runs": 10, "tokens": 12345, "costUSD": "41.5"},
    "reserved": {"tokens": 8192, "costUSD": "0.05"},
    "summary": {"concurrentRuns": "2/5", "runs": "10/100", "tokens": "12345/2000000", "costUSD": "41.50/50"},
    "admitted": [
        {"uid": "u-1", "name": "one", "at": "2026-11-24T09:00:00Z"},
        {"uid": "u-2", "name": "two", "at": "2026-11-24T09:01:00Z"},
    ],
    "reservations": [
        {
            "uid": "u-1",
            "name": "one",
            "id": "r-1",
            "holder": "op/1",
            "tokens": 8192,
            "costUSD": "0.05",
            "at": "2026-11-24T09:02:00Z",
        }
    ],
    "buckets": [{"start": "2026-11-24T09:00:00Z", "runs": 10, "tokens": 12345, "costUSD": "41.5"}],
    "lost": {"requests": 1, "tokens": 5000, "costUSD": "0.02"},
    "refused": {"runs": 3, "requests": 1},
}


def quotas_path(namespace: str, name: str = "") -> str:
    """The quota collection (or one quota) of any namespace, for the second namespace too."""
    base = f"{RUNS_API}/namespaces/{namespace}/agentrunquotas"
    return f"{base}/{name}" if name else base


async def create_quota(cluster: TestCluster, body: dict[str, Any], status: dict[str, Any] | None) -> None:
    """Created, then its status written with a PUT of the status subresource, as the ledger writer does.

    A real server may take a moment after Established to serve the new resource: retried until it does.
    """
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    created: dict[str, Any] = {}

    async def create() -> bool:
        code, answer = await cluster.status_of("POST", quotas_path(namespace), json=body)
        assert code in (201, 404), answer
        created.update(answer if code == 201 else {})
        return code == 201

    await until(create, f"AgentRunQuota {namespace}/{name} created", timeout=30)
    if status is not None:
        stored = await cluster.request(
            "PUT", quotas_path(namespace, name) + "/status", json={**created, "status": status}
        )
        assert stored["status"] == status


@pytest.fixture
async def other_namespace(cluster: TestCluster) -> AsyncIterator[str]:
    """A second namespace of the test's own (deleted afterwards)."""
    name = f"{cluster.namespace}-b" if cluster.real else f"team-{secrets.token_hex(3)}"
    await cluster.request("POST", "/api/v1/namespaces", json={"metadata": {"name": name}})
    try:
        yield name
    finally:
        await cluster.status_of("DELETE", f"/api/v1/namespaces/{name}")


async def plugin(cluster: TestCluster, *args: str, kubeconfig: Path | None = None) -> tuple[int, str, str]:
    """The plugin as a user runs it whose kubeconfig context names the test namespace."""
    config = kubeconfig or cluster.kubeconfig_in_namespace()
    code, out, err = await run_command(PLUGIN, *args, env={"KUBECONFIG": str(config)}, timeout=60)
    assert "Traceback" not in out + err, err
    return code, out, err


def table(out: str) -> list[list[str]]:
    """Cells of each table row (`kubectl get` layout: cells at least three spaces apart)."""
    rows = out.split("\n\n")[0].splitlines()
    return [[cell.strip() for cell in row.split("   ") if cell.strip()] for row in rows]


def rows_by_name(out: str) -> dict[str, dict[str, str]]:
    header, *rows = table(out)
    return {row[header.index("NAME")]: dict(zip(header, row, strict=True)) for row in rows}


async def test_quota_shows_each_quota_of_the_namespace_used_against_hard_with_reservations_lost_and_refused(
    cluster: TestCluster,
) -> None:
    await install_quota_crd(cluster)
    hard = {"concurrentRuns": 5, "runs": 100, "tokens": 2000000, "costUSD": 50}
    await create_quota(
        cluster, quota("daily", namespace=cluster.namespace, window="Day", hard=hard), DAILY_STATUS
    )
    monthly_status = {"used": {"concurrentRuns": 0, "runs": 40, "tokens": 900, "costUSD": "0.004"}}
    await create_quota(
        cluster,
        quota("monthly", namespace=cluster.namespace, window="Month", hard={"tokens": 1000}),
        monthly_status,
    )
    await create_quota(cluster, quota("fresh", namespace=cluster.namespace, hard={"runs": 3}), None)

    code, out, err = await plugin(cluster, "quota")
    assert code == 0, err
    assert table(out)[0] == [
        "NAME",
        "WINDOW",
        "CONCURRENT",
        "RUNS",
        "TOKENS",
        "COST",
        "RESERVED TOKENS",
        "RESERVED COST",
        "LOST",
        "REFUSED",
    ]
    rows = rows_by_name(out)
    assert list(rows) == ["daily", "fresh", "monthly"]
    assert rows["daily"] == {
        "NAME": "daily",
        "WINDOW": "Day",
        "CONCURRENT": "2/5",
        "RUNS": "10/100",
        "TOKENS": "12345/2000000",
        "COST": "$41.50/$50.00",
        "RESERVED TOKENS": "8192",
        "RESERVED COST": "$0.05",
        "LOST": "1",
        "REFUSED": "3 runs, 1 request",
    }
    # Limits the quota does not set show the usage alone; the window defaults to Day.
    assert [rows["monthly"][c] for c in ("WINDOW", "CONCURRENT", "RUNS", "TOKENS", "COST")] == [
        "Month",
        "0",
        "40",
        "900/1000",
        "<$0.01",
    ]
    assert [rows["fresh"][c] for c in ("WINDOW", "RUNS", "LOST")] == ["Day", "0/3", "0"]
    assert out.rstrip().endswith(
        f"no usage recorded yet for {cluster.namespace}/fresh: no operator has written its status"
    )

    code, out, err = await plugin(cluster, "quota", "-o", "json")
    assert code == 0, err
    daily = next(row for row in json.loads(out) if row["name"] == "daily")
    assert daily["used"] == DAILY_STATUS["used"]
    assert daily["reserved"] == DAILY_STATUS["reserved"]
    assert daily["hard"] == hard


async def test_quota_through_kubectl_plugin_discovery_with_all_namespaces_adds_the_namespace_column(
    cluster: TestCluster, other_namespace: str
) -> None:
    await install_quota_crd(cluster)
    await create_quota(
        cluster, quota("daily", namespace=cluster.namespace, hard={"costUSD": 50}), DAILY_STATUS
    )
    await create_quota(
        cluster, quota("hourly", namespace=other_namespace, window="Hour", hard={"runs": 5}), DAILY_STATUS
    )
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is part of the development tools"
    env = {
        "KUBECONFIG": str(cluster.kubeconfig_in_namespace()),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    code, out, err = await run_command(kubectl, "agentrun", "quota", "-A", env=env, timeout=60)
    assert code == 0, err
    header, *rows = table(out)
    assert header[:3] == ["NAMESPACE", "NAME", "WINDOW"]
    # A shared real server may hold other tests' quotas too: ours are there, each in its namespace.
    ours = {(row[0], row[1]): row for row in rows if row[0] in (cluster.namespace, other_namespace)}
    assert set(ours) == {(cluster.namespace, "daily"), (other_namespace, "hourly")}
    assert ours[(other_namespace, "hourly")][2:5] == ["Hour", "2", "10/5"]
    assert ours[(cluster.namespace, "daily")][header.index("COST")] == "$41.50/$50.00"

    # -n picks the namespace; without -A only that namespace's quotas are listed.
    code, out, err = await plugin(cluster, "quota", "-n", other_namespace)
    assert code == 0, err
    assert list(rows_by_name(out)) == ["hourly"]


async def test_quota_in_a_namespace_without_quotas_says_so(cluster: TestCluster) -> None:
    await install_quota_crd(cluster)
    code, out, err = await plugin(cluster, "quota")
    assert (code, err) == (0, "")
    assert out == f"No AgentRunQuotas found in namespace {cluster.namespace}.\n"


@pytest.mark.emulator_only(
    "needs a server without the AgentRunQuota CRD: a shared real server's CRD cannot be removed under "
    "the other tests that use it"
)
async def test_quota_without_the_crd_says_in_one_line_how_to_install_it(cluster: TestCluster) -> None:
    code, out, err = await plugin(cluster, "quota")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"error: cannot list agentrunquotas in namespace {cluster.namespace}: the AgentRunQuota CRD "
        "(agentrunquotas.agentrun.dev) is not installed; install the CRDs with "
        "`agentrun crd --all | kubectl apply -f -`"
    ]


async def _reader_without_quota_access(cluster: TestCluster) -> Path:
    """A ServiceAccount that may read AgentRuns but not AgentRunQuotas, as a kubeconfig with its token."""
    manifests = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "runs-reader"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "runs-reader", "namespace": cluster.namespace},
            "rules": [{"apiGroups": ["agentrun.dev"], "resources": ["agentruns"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "runs-reader", "namespace": cluster.namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "runs-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "runs-reader", "namespace": cluster.namespace}],
        },
    ]
    for manifest in manifests:
        await cluster.apply(manifest)
    username = f"system:serviceaccount:{cluster.namespace}:runs-reader"
    if cluster.emulator is not None:
        token = f"runs-reader-{secrets.token_hex(4)}"
        groups = (*service_account_groups(username), "system:authenticated")
        cluster.emulator.identities[token] = UserInfo(username, groups)
        cluster.emulator.authorizers[token] = StoredRbac(cluster.emulator, username, groups)
    else:
        code, token = await cluster.kubectl("create", "token", "runs-reader", "--duration=1h")
        assert code == 0, token
    # The admin kubeconfig in the test namespace, with the token as its only credential (a client
    # certificate would win over the token: kube-apiserver tries x509 first).
    config = yaml.safe_load(cluster.kubeconfig_in_namespace().read_text())
    for user in config["users"]:
        user["user"] = {"token": token.strip()}
    path = cluster.workdir / f"runs-reader-{secrets.token_hex(4)}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_quota_without_rbac_to_list_quotas_says_in_one_line_which_permission_is_missing(
    cluster: TestCluster,
) -> None:
    await install_quota_crd(cluster)
    kubeconfig = await _reader_without_quota_access(cluster)
    # The Role reaches the authorizer a moment after it is stored on a real server: wait for a 403
    # on quotas while the same identity can already list runs.
    outcome: tuple[int, str, str] = (0, "", "")

    async def refused() -> bool:
        nonlocal outcome
        outcome = await plugin(cluster, "quota", kubeconfig=kubeconfig)
        return outcome[0] == 1 and "forbidden" in outcome[2]

    await until(refused, "the quota listing refused for lack of RBAC", timeout=30)
    _, out, err = outcome
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    prefix = f"error: cannot list agentrunquotas in namespace {cluster.namespace}: forbidden (HTTP 403: "
    assert lines[0].startswith(prefix), err
    assert f'User "system:serviceaccount:{cluster.namespace}:runs-reader" cannot list resource' in lines[0]
    assert '"agentrunquotas"' in lines[0]
    assert lines[0].endswith(
        "); grant this identity the RBAC permission the message names, or use another context"
    )
