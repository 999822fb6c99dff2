"""The AgentRunQuota API as an API server serves it: the CRD, its columns and explanations, its CEL rule,
and the per-run policy (deploy/quota-policy.yaml) refusing runs above a quota's maxima.

No operator runs here: these are the answers of the API server alone, the same on the emulator and on
a real kube-apiserver.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.approval_policy import create_namespaced_policy
from tests.support.builders import agentrun
from tests.support.clusters import ROOT, TestCluster
from tests.support.quotas import QUOTA_CRD, quota, quotas_path
from tests.support.waiting import until

POLICY = ROOT / "deploy" / "quota-policy.yaml"
PER_RUN = {
    "tokenBudget": {"max": 200000, "default": 100000},
    "costBudgetUSD": {"max": 5, "default": 2},
    "maxIterations": {"max": 10},
    "timeoutSeconds": {"max": 600, "default": 300},
}


async def _apply_quota_crd(cluster: TestCluster) -> None:
    """Applied as a user would; on a real server it stays (shared by every test there)."""
    code, out = await cluster.kubectl("apply", "-f", str(QUOTA_CRD))
    assert code == 0, out
    code, out = await cluster.kubectl(
        "wait", "--for=condition=Established", "crd/agentrunquotas.agentrun.dev", "--timeout=60s"
    )
    assert code == 0, out


async def _eventually(cluster: TestCluster, *args: str, expect: str, timeout: float = 30.0) -> str:
    """kubectl until its output holds ``expect`` (a real server publishes a new schema after 1-2 s)."""
    _, out = await until(
        lambda: cluster.kubectl(*args),
        f"kubectl {' '.join(args)} to show {expect!r}",
        timeout,
        done=lambda answer: answer[0] == 0 and expect in answer[1],
        every=0.5,
        explain=lambda answer: answer[1],
    )
    return out


async def test_kubectl_get_agentrunquota_shows_used_against_hard_in_columns(cluster: TestCluster) -> None:
    await _apply_quota_crd(cluster)
    await cluster.apply(quota("team", namespace=cluster.namespace, window="Hour", hard={"concurrentRuns": 5}))
    summary = {"concurrentRuns": "2/5", "runs": "10", "tokens": "12345", "costUSD": "0.12"}
    await cluster.request(
        "PATCH",
        quotas_path(cluster, "team") + "/status",
        json={"status": {"summary": summary}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    out = await _eventually(cluster, "get", "agentrunquota", expect="2/5")
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "WINDOW", "CONCURRENT", "RUNS", "TOKENS", "COST", "AGE"]
    assert row.split()[:6] == ["team", "Hour", "2/5", "10", "12345", "0.12"]
    # The short name and the category reach it too.
    assert "team" in await _eventually(cluster, "get", "arq", expect="team")
    assert "agentrunquota.agentrun.dev/team" in await _eventually(
        cluster, "get", "agents", "-o", "name", expect="agentrunquota"
    )


async def test_kubectl_explain_documents_every_hard_limit(cluster: TestCluster) -> None:
    await _apply_quota_crd(cluster)
    out = await _eventually(cluster, "explain", "agentrunquota.spec.hard", expect="costUSD")
    for field in ("concurrentRuns", "runs", "tokens", "costUSD"):
        assert re.search(rf"^\s+{field}\s+<(integer|number)>", out, re.MULTILINE), out
    assert "Runs admitted and not finished at the same time" in out
    per_run = await _eventually(
        cluster, "explain", "agentrunquota.spec.perRun.tokenBudget", expect="Largest tokenBudget"
    )
    assert "tokenBudget of a run that declares none; at most max." in " ".join(per_run.split())


async def test_a_quota_whose_default_is_above_its_max_is_refused_by_the_crd(cluster: TestCluster) -> None:
    await _apply_quota_crd(cluster)
    wrong = quota(
        "wrong",
        namespace=cluster.namespace,
        perRun={"tokenBudget": {"max": 1000, "default": 5000}, "maxIterations": {"max": 5, "default": 5}},
    )
    status, body = await cluster.status_of("POST", quotas_path(cluster), json=wrong)
    assert status == 422, body
    assert [(c["field"], c["message"]) for c in body["details"]["causes"]] == [
        ("spec.perRun.tokenBudget", "Invalid value: default must not be above max")
    ]
    assert (await cluster.status_of("GET", quotas_path(cluster, "wrong")))[0] == 404


@pytest.fixture
async def quota_policy(cluster: TestCluster) -> AsyncIterator[str]:
    """The shipped per-run policy, bound to this test's namespace only (a real server is shared)."""
    await _apply_quota_crd(cluster)
    name = f"quotaapi-{cluster.namespace}"
    await create_namespaced_policy(cluster, POLICY, name)
    try:
        yield name
    finally:
        await cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", name)


async def _create(cluster: TestCluster, run: dict[str, Any], *, dry_run: bool = False) -> tuple[int, Any]:
    query = "?dryRun=All" if dry_run else ""
    return await cluster.status_of("POST", cluster.runs_path + query, json=run)


async def _until_enforced(cluster: TestCluster, run: dict[str, Any], timeout: float = 30.0) -> str:
    """A real server loads a new policy, and the informer of its paramKind, after a moment: dry runs
    until the refusal names a quota (until then the run is admitted, or the binding not configured)."""
    _, body = await until(
        lambda: _create(cluster, run, dry_run=True),
        "the quota policy to refuse the run naming a quota",
        timeout,
        done=lambda answer: answer[0] == 403 and "quota " in str(answer[1].get("message")),
        every=0.5,
    )
    return str(body["message"])


async def test_the_quota_policy_refuses_a_run_above_a_quotas_maximum_naming_quota_and_field(
    cluster: TestCluster, quota_policy: str
) -> None:
    ns = cluster.namespace
    await cluster.request("POST", quotas_path(cluster), json=quota("roomy", namespace=ns, perRun=PER_RUN))
    tight = {"tokenBudget": {"max": 300000}, "costBudgetUSD": {"max": 1.5}}
    await cluster.request("POST", quotas_path(cluster), json=quota("tight", namespace=ns, perRun=tight))

    greedy = agentrun("greedy", "t", namespace=ns, limits={"tokenBudget": 250000})
    message = await _until_enforced(cluster, greedy)
    assert message == (
        f"agentruns.agentrun.dev \"greedy\" is forbidden: ValidatingAdmissionPolicy '{quota_policy}' with "
        f"binding '{quota_policy}' denied request: quota {ns}/roomy: spec.limits.tokenBudget 250000 is "
        "above perRun.tokenBudget.max 200000"
    )
    status, body = await _create(cluster, greedy)
    assert (status, body["reason"]) == (403, "Forbidden")
    assert await cluster.get_run("greedy") is None

    # Every quota of the namespace is checked: "tight" holds a lower cost maximum than "roomy".
    costly = agentrun("costly", "t", namespace=ns, limits={"costBudgetUSD": 2.5})
    status, body = await _create(cluster, costly)
    assert status == 403
    assert body["message"].endswith(
        f"quota {ns}/tight: spec.limits.costBudgetUSD 2.5 is above perRun.costBudgetUSD.max 1.5"
    )
    for limits, field in (
        ({"maxIterations": 11}, "maxIterations 11"),
        ({"timeoutSeconds": 601}, "timeoutSeconds 601"),
    ):
        status, body = await _create(cluster, agentrun("over", "t", namespace=ns, limits=limits))
        assert status == 403 and f"quota {ns}/roomy: spec.limits.{field} is above" in body["message"], body

    # Within every maximum, and a run declaring no limits at all (the operator gives it the defaults):
    # the API server stores no default of its own that a maximum would then refuse.
    within = {"tokenBudget": 200000, "costBudgetUSD": 1.5, "maxIterations": 10, "timeoutSeconds": 600}
    assert (await _create(cluster, agentrun("within", "t", namespace=ns, limits=within)))[0] == 201
    assert (await _create(cluster, agentrun("undeclared", "t", namespace=ns)))[0] == 201
    stored = await cluster.get_run("undeclared")
    assert stored is not None
    assert "limits" not in stored["spec"]


async def test_without_a_quota_in_the_namespace_the_policy_admits_every_run(
    cluster: TestCluster, quota_policy: str
) -> None:
    ns = cluster.namespace
    big = agentrun("big", "t", namespace=ns, limits={"tokenBudget": 10_000_000, "maxIterations": 500})
    assert (await _create(cluster, big))[0] == 201
    # The same run is refused once a quota appears (proof the policy was live all along).
    await cluster.request("POST", quotas_path(cluster), json=quota("q", namespace=ns, perRun=PER_RUN))
    await _until_enforced(cluster, {**big, "metadata": {"name": "big-2", "namespace": ns}})


async def test_the_agentrun_crd_takes_a_mutable_priority_within_bounds(cluster: TestCluster) -> None:
    out = await _eventually(cluster, "explain", "agentrun.spec.priority", expect="higher goes first")
    assert "<integer>" in out
    await cluster.apply(agentrun("urgent", "t", namespace=cluster.namespace, priority=5))
    run = await cluster.get_run("urgent")
    assert run is not None and run["spec"]["priority"] == 5
    merge = {"Content-Type": "application/merge-patch+json"}
    path = f"{cluster.runs_path}/urgent"
    await cluster.request("PATCH", path, json={"spec": {"priority": -3}}, headers=merge)
    run = await cluster.get_run("urgent")
    assert run is not None and run["spec"]["priority"] == -3
    status, body = await cluster.status_of("PATCH", path, json={"spec": {"priority": 1001}}, headers=merge)
    assert status == 422 and "spec.priority" in body["message"], body
    default = agentrun("plain", "t", namespace=cluster.namespace)
    await cluster.apply(default)
    stored = await cluster.get_run("plain")
    # No default stored: the operator reads a missing priority as 0 (its description says so).
    assert stored is not None and "priority" not in stored["spec"]
