"""A run's sandbox pod through the real operator, up to where a kubelet would take over.

What these scenarios prove without a node: the pod is created by the run's ServiceAccount (RBAC
decides), with the isolation the operator fixes whatever the run declares, beside a NetworkPolicy
denying its egress; a pod that never starts ends the run clearly; both go when the run ends. The
commands themselves, the workspace across a crash and the limits need a kubelet: tests/node/.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from tests.support.builders import agent, agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, until, wait_status
from tests.support.operator_process import OperatorProcess
from tests.support.rbac import grant_service_account
from tests.support.sandboxes import SANDBOX_RULES, one_command, unstartable_sandbox

API_KEY = "sk-ant-sandbox-integration-0123456789"
NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            one_command("[scenario:sandbox]", "toolu_bash1"),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


async def _pod_of(cluster: TestCluster, run_uid: str) -> dict[str, Any] | None:
    pods = await cluster.request(
        "GET", cluster.path("pods"), params={"labelSelector": f"agentrun.dev/run-uid={run_uid}"}
    )
    items: list[dict[str, Any]] = pods["items"]
    return items[0] if items else None


async def test_the_sandbox_pod_is_made_by_the_runs_account_isolated_and_gone_with_the_run(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await grant_service_account(cluster, "sandboxer", SANDBOX_RULES, probe=cluster.path("pods"))
    manifest = agentrun(
        "builder",
        "[scenario:sandbox] run the tests",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="sandboxer",
        sandbox=unstartable_sandbox(
            env=[{"name": "CI", "value": "true"}], egress=[{"cidr": "10.0.0.0/8", "ports": [443]}]
        ),
    )
    created = await cluster.request("POST", cluster.runs_path, json=manifest)
    uid = created["metadata"]["uid"]

    pod = await until(lambda: _pod_of(cluster, uid), "the sandbox pod", timeout=60)
    spec = pod["spec"]
    container = spec["containers"][0]
    assert pod["metadata"]["ownerReferences"][0]["uid"] == uid
    assert spec["serviceAccountName"] == "sandboxer" and spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "128Mi"}
    assert {"name": "CI", "value": "true"} in container["env"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/workspace", "/tmp", "/agentrun"}
    policies = await cluster.request("GET", NETWORK_POLICIES.format(ns=cluster.namespace))
    [policy] = [p for p in policies["items"] if p["metadata"]["name"] == pod["metadata"]["name"]]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"protocol": "TCP", "port": 443}]}
    ]

    final = await wait_status(cluster, "builder", phase_in("Succeeded", "Failed"), timeout=120)
    assert (final["phase"], final["stopReason"]) == ("Failed", "FatalToolError"), final.get("message")
    # No node: Pending until the start timeout; a node refuses the image at once.
    assert "sandbox pod" in final["message"]
    assert "did not start within 10 s" in final["message"] or "ErrImageNeverPull" in final["message"]
    sent = model.requests_for("[scenario:sandbox]")[0].body["tools"]
    assert [{k: tool[k] for k in ("type", "name")} for tool in sent] == [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]

    async def gone() -> bool:
        return await _pod_of(cluster, uid) is None

    await until(gone, "the sandbox pod deleted with the end of the run", timeout=60)
    remaining = await cluster.request("GET", NETWORK_POLICIES.format(ns=cluster.namespace))
    assert [p["metadata"]["name"] for p in remaining["items"]] == []


async def test_a_run_waits_for_the_secret_its_sandbox_mounts_then_its_pod_mounts_every_volume(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await grant_service_account(cluster, "mounter", SANDBOX_RULES, probe=cluster.path("pods"))
    config_map = {"metadata": {"name": "lint-rules"}, "data": {"rules.toml": "line-length = 110\n"}}
    await cluster.request("POST", cluster.path("configmaps"), json=config_map)
    volumes = [
        {"name": "rules", "mountPath": "/etc/lint", "configMap": {"name": "lint-rules"}},
        {"name": "token", "mountPath": "/var/run/git", "secret": {"secretName": "git-token"}},
        {
            "name": "cache",
            "mountPath": "/cache",
            "persistentVolumeClaim": {"claimName": "cache", "readOnly": True},
        },
        {"name": "repo", "mountPath": "/workspace", "emptyDir": {"sizeLimit": "2Gi"}},
    ]
    manifest = agentrun(
        "mounted",
        "[scenario:sandbox] run the tests",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="mounter",
        sandbox=unstartable_sandbox(volumes=volumes),
    )
    created = await cluster.request("POST", cluster.runs_path, json=manifest)
    uid = created["metadata"]["uid"]

    pending = await wait_status(cluster, "mounted", lambda s: s.get("phase") == "Pending" and "message" in s)
    assert {c["type"]: c["reason"] for c in pending["conditions"]}["Succeeded"] == "SecretNotFound"
    assert pending["message"] == (
        f"Secret {cluster.namespace}/git-token (spec.sandbox.volumes[1].secret) does not exist yet; "
        "the run starts once it does"
    )
    assert model.requests_for("[scenario:sandbox]") == [] and await _pod_of(cluster, uid) is None
    secret = {"metadata": {"name": "git-token"}, "stringData": {"token": "ghp-not-read-by-the-operator"}}
    await cluster.request("POST", cluster.path("secrets"), json=secret)

    pod = await until(lambda: _pod_of(cluster, uid), "the sandbox pod", timeout=60)
    by_name = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert set(by_name) == {"tmp", "agentrun", "rules", "token", "cache", "repo"}  # repo is the workspace
    assert by_name["rules"]["configMap"] == {"name": "lint-rules", "defaultMode": 0o444}
    assert by_name["token"]["secret"] == {"secretName": "git-token", "defaultMode": 0o440}
    assert by_name["cache"]["persistentVolumeClaim"] == {"claimName": "cache", "readOnly": True}
    assert by_name["repo"]["emptyDir"] == {"sizeLimit": "2Gi"}
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert set(mounts) == {"/workspace", "/tmp", "/agentrun", "/etc/lint", "/var/run/git", "/cache"}
    assert mounts["/workspace"]["name"] == "repo" and not mounts["/workspace"].get("readOnly")
    assert all(mounts[path]["readOnly"] is True for path in ("/etc/lint", "/var/run/git", "/cache"))

    final = await wait_status(cluster, "mounted", phase_in("Succeeded", "Failed"), timeout=120)
    assert (final["phase"], final["stopReason"]) == ("Failed", "FatalToolError"), final.get("message")


async def test_a_run_whose_account_may_not_create_pods_fails_naming_what_it_needs(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    reader = await grant_service_account(
        cluster,
        "no-pods",
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        probe=cluster.path("pods"),
    )
    manifest = agentrun(
        "refused",
        "[scenario:sandbox] run the tests",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="no-pods",
        sandbox=unstartable_sandbox(),
    )
    created = await cluster.request("POST", cluster.runs_path, json=manifest)
    final = await wait_status(cluster, "refused", phase_in("Succeeded", "Failed"), timeout=60)
    assert (final["phase"], final["stopReason"]) == ("Failed", "FatalToolError"), final.get("message")
    assert f"{reader} may not create the sandbox pod" in final["message"]
    assert "needs create, get and delete on pods" in final["message"]
    assert await _pod_of(cluster, created["metadata"]["uid"]) is None


async def test_the_api_server_refuses_a_warm_pool_on_a_run_of_its_own(cluster: TestCluster) -> None:
    manifest = agentrun(
        "pooled",
        "x",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        sandbox=unstartable_sandbox(warmPool=2),
    )
    code, out = await cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    assert code != 0
    assert "spec.sandbox.warmPool is kept by an Agent for its runs; set it on the Agent" in out


async def test_an_agents_warm_pool_is_started_as_its_account_and_goes_with_the_agent(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    await grant_service_account(cluster, "pooler", SANDBOX_RULES, probe=cluster.path("pods"))
    agents = cluster.path("agents", api="/apis/agentrun.dev/v1alpha1")
    manifest = agent(
        "pooled",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="pooler",
        sandbox=unstartable_sandbox(warmPool=2),
    )
    created = await cluster.request("POST", agents, json=manifest)
    uid = created["metadata"]["uid"]

    async def pool() -> list[dict[str, Any]]:
        pods = await cluster.request(
            "GET", cluster.path("pods"), params={"labelSelector": f"agentrun.dev/sandbox-pool-agent={uid}"}
        )
        return [pod for pod in pods["items"] if not pod["metadata"].get("deletionTimestamp")]

    pods = await until(pool, "two warm pods", timeout=60, done=lambda found: len(found) == 2)
    for pod in pods:
        assert pod["metadata"]["name"].startswith("pooled-sandbox-pool-")
        assert [(o["kind"], o["uid"]) for o in pod["metadata"]["ownerReferences"]] == [("Agent", uid)]
        assert pod["spec"]["serviceAccountName"] == "pooler"
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert "agentrun.dev/run-uid" not in pod["metadata"]["labels"]
    policies = await cluster.request("GET", NETWORK_POLICIES.format(ns=cluster.namespace))
    [policy] = [p for p in policies["items"] if p["metadata"]["name"].startswith("pooled-sandbox-pool-")]
    pool_label = pods[0]["metadata"]["labels"]["agentrun.dev/sandbox-pool"]
    assert policy["spec"]["podSelector"]["matchLabels"]["agentrun.dev/sandbox-pool"] == pool_label
    # Deny-all: no egress rule (a real server omits the empty list; so does the emulator).
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "egress" not in policy["spec"]

    await cluster.request("DELETE", f"{agents}/pooled")
    await until(pool, "the warm pods deleted with the Agent", timeout=90, done=lambda found: found == [])


async def test_an_agents_warm_pool_that_cannot_be_filled_says_why_in_its_status(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    # The account may list and delete pods, not create them.
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "delete"]}]
    await grant_service_account(cluster, "lister", rules, probe=cluster.path("pods"))
    agents = cluster.path("agents", api="/apis/agentrun.dev/v1alpha1")
    manifest = agent(
        "unfilled",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="lister",
        sandbox=unstartable_sandbox(warmPool=2),
    )
    await cluster.request("POST", agents, json=manifest)

    async def pool_status() -> dict[str, Any]:
        found = await cluster.request("GET", f"{agents}/unfilled")
        return dict((found.get("status") or {}).get("warmPool") or {})

    said = await until(
        pool_status, "status.warmPool with a message", timeout=60, done=lambda s: "message" in s
    )
    assert said["size"] == 2 and said["ready"] == 0, said
    user = f"system:serviceaccount:{cluster.namespace}:lister"
    assert said["message"].startswith(f"{user} could not create pool pods: "), said
    assert said["message"].endswith(
        "(the Agent's ServiceAccount needs create, list and delete on pods for a warm pool)"
    ), said
    # Granted the right, the pool fills and the message goes.
    role = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{cluster.namespace}/roles/lister"
    granted = await cluster.request("GET", role)
    granted["rules"] = [*rules, {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    await cluster.request("PUT", role, json=granted)
    filled = await until(pool_status, "the message cleared", timeout=60, done=lambda s: "message" not in s)
    assert filled["size"] == 2, filled
