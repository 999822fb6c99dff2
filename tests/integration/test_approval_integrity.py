"""Recorded approvals are evidence: they never change, and a decision is recorded in its decider's name.

The same scenarios run against the emulator and, with `--real-cluster`, against a real kube-apiserver:
the CRD keeps spec.approvals append-only (CEL), the approval policy (deploy/approval-policy.yaml, also
in the chart) admits a new decision only under the requesting user's name, and `kubectl agentrun`
records the name the server authenticates, not a kubeconfig label.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from agentrun_sandbox.kube.authz import UserInfo, service_account_groups
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.approval_policy import approval_policy_in_force
from tests.support.builders import agentrun
from tests.support.clusters import Credentials, TestCluster
from tests.support.kube_requests import phase_in, wait_status

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "deploy" / "approval-policy.yaml"
PLUGIN = Path(sys.executable).parent / "kubectl-agentrun"
APPEND_ONLY = (
    "spec.approvals: Invalid value: spec.approvals is append-only: "
    "recorded decisions cannot be changed, reordered or removed"
)
JSON_PATCH = "application/json-patch+json"


def _run(cluster: TestCluster, name: str, **spec: Any) -> str:
    return json.dumps(agentrun(name, "approve me", namespace=cluster.namespace, **spec))


@dataclass(frozen=True)
class Identity:
    """Someone else: own credentials (a ServiceAccount token) and the user name the server gives them.

    Requests go over HTTP directly: kubectl sends no bearer token to a plain-HTTP server (the emulator).
    """

    username: str
    credentials: Credentials

    async def send(self, method: str, path: str, body: Any, content_type: str) -> tuple[int, dict[str, Any]]:
        connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context)
        async with (
            aiohttp.ClientSession(
                self.credentials.server, headers=self.credentials.headers, connector=connector
            ) as session,
            session.request(
                method, path, data=json.dumps(body), headers={"Content-Type": content_type}
            ) as answer,
        ):
            return answer.status, await answer.json()


async def _create(cluster: TestCluster, name: str, **spec: Any) -> tuple[int, str]:
    return await cluster.kubectl("create", "-f", "-", stdin=_run(cluster, name, **spec))


async def _patch(cluster: TestCluster, name: str, ops: list[dict[str, Any]]) -> tuple[int, str]:
    return await cluster.kubectl("patch", "agentrun", name, "--type=json", "-p", json.dumps(ops))


def _appending(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"op": "add", "path": "/spec/approvals/-", "value": entry}]


async def _approvals(cluster: TestCluster, name: str) -> list[dict[str, Any]]:
    run = await cluster.get_run(name)
    assert run is not None
    approvals: list[dict[str, Any]] = run["spec"].get("approvals", [])
    return approvals


async def _whoami(cluster: TestCluster) -> str:
    code, out = await cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert code == 0 and out, out
    return out


@pytest.fixture
async def alice(cluster: TestCluster) -> Identity:
    """The ServiceAccount alice, allowed to create, read and patch AgentRuns in the test namespace.

    A real server mints her a token; the emulator, which authenticates nobody, is told who her token is.
    """
    username = f"system:serviceaccount:{cluster.namespace}:alice"
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "alice"}}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "approver", "namespace": cluster.namespace},
        "rules": [
            {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"], "verbs": ["get", "patch", "create"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "approvers", "namespace": cluster.namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "approver"},
        "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": cluster.namespace}],
    }
    for obj in (account, role, binding):
        await cluster.apply(obj)
    if cluster.emulator is not None:
        token = f"alice-{cluster.namespace}"
        cluster.emulator.identities[token] = UserInfo(
            username, (*service_account_groups(username), "system:authenticated")
        )
    else:
        code, token = await cluster.kubectl("create", "token", "alice", "--duration=1h")
        assert code == 0, token
    # The admin's kubeconfig with her token instead of the admin's credentials (a client certificate
    # would win over the token: kube-apiserver tries x509 first).
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    for user in config["users"]:
        if user["name"] == context["user"]:
            user["user"] = {"token": token.strip()}
    path = cluster.workdir / "alice.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return Identity(username, Credentials.from_kubeconfig(path, cluster.workdir))


@pytest.fixture
async def approval_policy(cluster: TestCluster) -> AsyncIterator[str]:
    async with approval_policy_in_force(cluster) as name:
        yield name


# --- append-only: the CRD's own rules, with or without the policy ----------------------------------------

Decisions = tuple[dict[str, Any], dict[str, Any]]


@pytest.fixture
async def decisions(cluster: TestCluster) -> Decisions:
    """Two decisions in the name of whoever runs the test, so the approval policy never matters here
    (on a shared real server, a chart installed by another test brings it cluster-wide)."""
    me = await _whoami(cluster)
    return (
        {"toolUseId": "toolu_a", "decision": "approve", "by": me},
        {"toolUseId": "toolu_b", "decision": "deny", "by": me, "reason": "not today"},
    )


async def test_a_recorded_decision_cannot_be_rewritten_in_place(
    cluster: TestCluster, decisions: Decisions
) -> None:
    a, _ = decisions
    assert (await _create(cluster, "rewrite", approvals=[a]))[0] == 0
    rewrite = [{"op": "replace", "path": "/spec/approvals/0/decision", "value": "deny"}]
    code, out = await _patch(cluster, "rewrite", rewrite)
    assert code != 0 and APPEND_ONLY in out, out
    code, out = await _patch(
        cluster, "rewrite", [{"op": "add", "path": "/spec/approvals/0/reason", "value": "later"}]
    )
    assert code != 0 and APPEND_ONLY in out, out
    assert await _approvals(cluster, "rewrite") == [a]


async def test_the_decisions_cannot_be_swapped_for_as_many_others_or_reordered(
    cluster: TestCluster, decisions: Decisions
) -> None:
    a, b = decisions
    assert (await _create(cluster, "swap", approvals=[a, b]))[0] == 0
    for replacement in ([{**a, "toolUseId": "toolu_z"}, b], [b, a]):
        merge = json.dumps({"spec": {"approvals": replacement}})
        code, out = await cluster.kubectl("patch", "agentrun", "swap", "--type=merge", "-p", merge)
        assert code != 0 and APPEND_ONLY in out, out
    assert await _approvals(cluster, "swap") == [a, b]


async def test_recorded_decisions_cannot_be_dropped_one_by_one_or_with_the_whole_list(
    cluster: TestCluster, decisions: Decisions
) -> None:
    assert (await _create(cluster, "drop", approvals=list(decisions)))[0] == 0
    code, out = await _patch(cluster, "drop", [{"op": "remove", "path": "/spec/approvals/1"}])
    assert code != 0 and APPEND_ONLY in out, out
    removed = "spec: Invalid value: spec.approvals is append-only: the recorded decisions cannot be removed"
    code, out = await _patch(cluster, "drop", [{"op": "remove", "path": "/spec/approvals"}])
    assert code != 0 and removed in out, out
    code, out = await cluster.kubectl(
        "patch", "agentrun", "drop", "--type=merge", "-p", '{"spec":{"approvals":null}}'
    )
    assert code != 0 and removed in out, out
    assert await _approvals(cluster, "drop") == list(decisions)


async def test_decisions_are_appended_to_a_new_list_or_after_the_recorded_ones(
    cluster: TestCluster, decisions: Decisions
) -> None:
    a, b = decisions
    assert (await _create(cluster, "append"))[0] == 0
    code, out = await _patch(cluster, "append", [{"op": "add", "path": "/spec/approvals", "value": [a]}])
    assert code == 0, out
    code, out = await _patch(cluster, "append", _appending(b))
    assert code == 0, out
    assert await _approvals(cluster, "append") == [a, b]


# --- the approval policy: the decider is the requesting user ---------------------------------------------


@pytest.mark.usefixtures("approval_policy")
async def test_the_policy_refuses_a_decision_recorded_in_someone_elses_name(
    cluster: TestCluster, alice: Identity
) -> None:
    me = await _whoami(cluster)
    mine = {"toolUseId": "toolu_a", "decision": "approve", "by": me}
    assert (await _create(cluster, "forged", approvals=[mine]))[0] == 0
    path = f"{cluster.runs_path}/forged"
    bobs = {"toolUseId": "toolu_b", "decision": "approve", "by": "bob"}
    status, body = await alice.send("PATCH", path, _appending(bobs), JSON_PATCH)
    assert (status, body["reason"], body["details"]["kind"]) == (403, "Forbidden", "agentruns"), body
    # Another copy of the same policy (a chart installed on a shared real server) may answer first.
    assert re.fullmatch(
        r'agentruns\.agentrun\.dev "forged" is forbidden: '
        r"ValidatingAdmissionPolicy '(?P<p>[-a-z0-9]+)' with binding '(?P=p)' denied request: "
        + re.escape(
            'spec.approvals: the decision on toolu_b names "bob" in by, but it is '
            f'recorded by "{alice.username}"; by must be the user name of whoever records the decision'
        ),
        body["message"],
    ), body["message"]
    # Her own name passes; the entry recorded earlier by someone else is not hers, and need not be.
    hers = {**bobs, "by": alice.username}
    status, body = await alice.send("PATCH", path, _appending(hers), JSON_PATCH)
    assert status == 200, body
    # Recording in her name is hers alone: the admin cannot do it either.
    code, out = await _patch(cluster, "forged", _appending({**hers, "toolUseId": "toolu_c"}))
    assert code != 0 and f'names "{alice.username}" in by, but it is recorded by "{me}"' in out, out
    assert [a["by"] for a in await _approvals(cluster, "forged")] == [me, alice.username]


@pytest.mark.usefixtures("approval_policy")
async def test_the_policy_checks_every_decision_a_new_run_arrives_with(
    cluster: TestCluster, alice: Identity
) -> None:
    hers = {"toolUseId": "toolu_a", "decision": "approve", "by": alice.username}
    bobs = {"toolUseId": "toolu_b", "decision": "deny", "by": "bob"}
    run = json.loads(_run(cluster, "preapproved", approvals=[hers, bobs]))
    status, body = await alice.send("POST", cluster.runs_path, run, "application/json")
    assert status == 403 and f'"bob" in by, but it is recorded by "{alice.username}"' in body["message"], body
    run["spec"]["approvals"] = [hers]
    status, body = await alice.send("POST", cluster.runs_path, run, "application/json")
    assert status == 201, body


# --- kubectl agentrun: the caller's own name, the server as the judge ------------------------------------


async def _with_pending(cluster: TestCluster, name: str, *ids: str) -> None:
    assert (
        await _create(cluster, name, tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}])
    )[0] == 0
    pending = [
        {
            "toolUseId": i,
            "toolName": "calculator",
            "input": {"expression": "1+1"},
            "since": "2025-01-01T00:00:00Z",
        }
        for i in ids
    ]
    await cluster.request(
        "PATCH",
        f"{cluster.runs_path}/{name}/status",
        data=json.dumps({"status": {"phase": "AwaitingApproval", "pendingApprovals": pending}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )


def _relabelled_kubeconfig(cluster: TestCluster) -> Path:
    """The same credentials under a user entry named like a laptop profile, not like the identity."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    for user in config["users"]:
        if user["name"] == context["context"]["user"]:
            user["name"] = "my-laptop-profile"
    context["context"]["user"] = "my-laptop-profile"
    for cluster_entry in config["clusters"]:  # relative certificate paths keep resolving
        for key in ("certificate-authority",):
            if key in cluster_entry["cluster"] and not os.path.isabs(cluster_entry["cluster"][key]):
                cluster_entry["cluster"][key] = str(cluster.kubeconfig.parent / cluster_entry["cluster"][key])
    path = cluster.workdir / "relabelled-kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def _plugin(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KUBE")}, "KUBECONFIG": str(kubeconfig)}
    process = await asyncio.create_subprocess_exec(
        str(PLUGIN), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


@pytest.mark.usefixtures("approval_policy")
async def test_the_plugin_records_the_name_the_server_authenticates_not_the_kubeconfig_entry(
    cluster: TestCluster,
) -> None:
    me = await _whoami(cluster)
    await _with_pending(cluster, "whoami", "toolu_a")
    code, out, err = await _plugin(
        _relabelled_kubeconfig(cluster), "approve", "whoami", "-n", cluster.namespace
    )
    assert code == 0, err
    assert out == f"agentrun.agentrun.dev/whoami: approved calculator (toolu_a) as {me}\n"
    assert await _approvals(cluster, "whoami") == [{"toolUseId": "toolu_a", "decision": "approve", "by": me}]


@pytest.mark.usefixtures("approval_policy")
async def test_the_plugin_reports_a_by_the_policy_refuses_in_one_clear_line(cluster: TestCluster) -> None:
    me = await _whoami(cluster)
    await _with_pending(cluster, "someone", "toolu_a")
    code, out, err = await _plugin(
        cluster.kubeconfig, "deny", "someone", "--by", "bob", "-n", cluster.namespace
    )
    assert (code, out) == (1, "")
    assert re.fullmatch(
        re.escape(
            "error: the API server refused the decision: spec.approvals: the decision on toolu_a names "
            f'"bob" in by, but it is recorded by "{me}"; by must be the user name of whoever records the '
            "decision (ValidatingAdmissionPolicy "
        )
        + r"[-a-z0-9]+-approval-decider(-[-a-z0-9]+)?"  # this test's, or a chart's on a shared server
        + re.escape("); without --by the decision is recorded under your own user name\n"),
        err,
    ), err
    assert "Traceback" not in err and err.count("\n") == 1
    assert await _approvals(cluster, "someone") == []


# --- the operator under the policy ---------------------------------------------------------------------

API_KEY = "sk-ant-integrity-0123456789"
SCENARIO = "[scenario:integrity-calc]"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    script = Script(
        SCENARIO,
        [
            Reply([tool_use_block("calculator", {"expression": "6*7"}, id="toolu_int1")]),
            Reply([text_block("42.")]),
        ],
    )
    async with FakeMessagesAPI(scripts=[script], require_api_key=API_KEY).running() as server:
        yield server


@pytest.mark.usefixtures("approval_policy")
async def test_under_the_policy_the_operator_runs_and_a_plugin_approval_lets_the_call_through(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    # The operator never writes spec.approvals, so the policy needs no exemption for its account.
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    tools = [{"builtin": {"name": "calculator"}, "requiresApproval": True}]
    async with cluster.operator(tmp_path / "operator.log", env):
        manifest = agentrun("guarded", f"{SCENARIO} what is 6*7?", namespace=cluster.namespace, tools=tools)
        await cluster.apply(manifest)
        await _wait_phase(cluster, "guarded", "AwaitingApproval")
        code, _, err = await _plugin(cluster.kubeconfig, "approve", "guarded", "-n", cluster.namespace)
        assert code == 0, err
        final = await _wait_phase(cluster, "guarded", "Succeeded", "Failed", "Cancelled")
    assert (final["phase"], final["toolCalls"], final["result"]) == ("Succeeded", 1, "42.")
    me = await _whoami(cluster)
    assert await _approvals(cluster, "guarded") == [
        {"toolUseId": "toolu_int1", "decision": "approve", "by": me}
    ]


async def _wait_phase(cluster: TestCluster, name: str, *phases: str, timeout: float = 60) -> dict[str, Any]:
    return await wait_status(cluster, name, phase_in(*phases), f"one of {phases}", timeout)


@pytest.mark.emulator_only(
    "an API server older than 1.28 (no SelfSubjectReview) is played by an injected 404"
)
async def test_without_a_self_subject_review_the_plugin_asks_for_by_instead_of_guessing(
    cluster: TestCluster,
) -> None:
    assert cluster.emulator is not None
    cluster.emulator.faults.add(verb="create", resource="selfsubjectreviews", status=404)
    await _with_pending(cluster, "old-server", "toolu_a", "toolu_b")
    code, out, err = await _plugin(
        cluster.kubeconfig, "approve", "old-server", "toolu_a", "-n", cluster.namespace
    )
    assert (code, out) == (1, "")
    assert err == (
        "error: cannot tell who you are: the API server answered a SelfSubjectReview with HTTP 404 "
        "(Kubernetes 1.28 or later serves it); pass --by NAME\n"
    )
    code, out, err = await _plugin(
        cluster.kubeconfig, "approve", "old-server", "toolu_a", "--by", "carol", "-n", cluster.namespace
    )
    assert code == 0, err
    assert await _approvals(cluster, "old-server") == [
        {"toolUseId": "toolu_a", "decision": "approve", "by": "carol"}
    ]
