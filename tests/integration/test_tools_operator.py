"""Tools through the real operator process: header Secrets that appear late, impersonated Kubernetes reads.

The Kubernetes tools act as the run's ServiceAccount: each scenario gives that account a Role of its
own, so what the tool may read and what it is refused is decided by the server's RBAC (the emulator
enforces stored roles on impersonated requests as a real server does).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, wait_status
from tests.support.operator_process import OperatorProcess
from tests.support.rbac import grant_service_account
from tests.unit.tools.servers import Answer, WebhookReceiver

API_KEY = "sk-ant-tools-integration-0123456789"
HOOK_TOKEN = "hook-token-s3cret-abcdef"
#: A node no kubelet answers for: a pod bound to it has no log the API server can fetch.
ABSENT_NODE = "agentrun-test-node-without-kubelet"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                "[scenario:webhook]",
                [
                    Reply([tool_use_block("notify", {"text": "deploy finished"}, id="toolu_hook1")]),
                    Reply([text_block("Notified.")]),
                ],
            ),
            Script(
                "[scenario:logs]",
                [
                    Reply([tool_use_block("pod_logs", {"name": "web-1", "tailLines": 2}, id="toolu_logs1")]),
                    Reply([text_block("The pod ran out of memory.")]),
                ],
            ),
            Script(
                "[scenario:rbac]",
                [
                    Reply(
                        [
                            tool_use_block("kubernetes_list", {"resource": "pods"}, id="toolu_pods"),
                            tool_use_block("kubernetes_list", {"resource": "secrets"}, id="toolu_secrets"),
                        ]
                    ),
                    Reply([text_block("web-1 runs; the secrets are not mine to read.")]),
                ],
            ),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_SECRET_RETRY_SECONDS": "0.5",
    }
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


def _tool_results(model: FakeMessagesAPI, tag: str) -> dict[str, dict[str, Any]]:
    """The tool_result blocks the model was sent back for the scenario ``tag``, by tool_use id."""
    requests = [m for m in model.requests if tag in json.dumps(m.body)]
    return {
        block["tool_use_id"]: block
        for request in requests
        for message in request.body["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    }


def _text(block: Mapping[str, Any]) -> str:
    content = block["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


async def _pod(cluster: TestCluster, name: str, service_account: str, **spec: Any) -> None:
    """A pod run by ``service_account`` (so admission never waits for the namespace's default one)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {
            "serviceAccountName": service_account,
            "containers": [{"name": "app", "image": "nginx"}],
            **spec,
        },
    }
    await cluster.request("POST", cluster.path("pods"), json=pod)


async def test_a_webhook_header_secret_created_later_takes_the_run_from_pending_to_succeeded(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    async with WebhookReceiver(default=Answer(200, {"delivered": True})).running() as receiver:
        webhook = {
            "name": "notify",
            "description": "Posts a message to the team channel.",
            "url": f"{receiver.url}/notify",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
            "headersFrom": {"name": "hook-headers", "key": "headers"},
        }
        manifest = agentrun(
            "notify",
            "[scenario:webhook] tell the team",
            namespace=cluster.namespace,
            model={"name": "claude-haiku-4-5"},
            tools=[{"http": webhook}],
        )
        created = await cluster.request("POST", cluster.runs_path, json=manifest)
        pending = await wait_status(cluster, "notify", phase_in("Pending", "Succeeded", "Failed"))
        assert pending["phase"] == "Pending"
        assert {c["type"]: c["reason"] for c in pending["conditions"]}["Succeeded"] == "SecretNotFound"
        assert f"{cluster.namespace}/hook-headers" in pending["message"]
        assert "spec.tools[0].http.headersFrom" in pending["message"]
        assert receiver.received == []

        headers = json.dumps({"Authorization": f"Bearer {HOOK_TOKEN}"})
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hook-headers", "namespace": cluster.namespace},
            "data": {"headers": base64.b64encode(headers.encode()).decode()},
        }
        await cluster.request("POST", cluster.path("secrets"), json=secret)
        final = await wait_status(cluster, "notify", phase_in("Succeeded", "Failed"))
    assert (final["phase"], final["result"]) == ("Succeeded", "Notified.")
    [received] = receiver.received
    assert received.body == {"text": "deploy finished"}
    assert received.headers["Authorization"] == f"Bearer {HOOK_TOKEN}"
    assert received.headers["Idempotency-Key"] == f"{created['metadata']['uid']}:toolu_hook1"
    assert HOOK_TOKEN not in operator.logs() and HOOK_TOKEN not in json.dumps(final)


async def test_kubernetes_tools_in_the_operator_may_read_what_the_runs_service_account_may_and_no_more(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    ns = cluster.namespace
    reader = await grant_service_account(
        cluster,
        "pod-reader",
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        probe=cluster.path("pods"),
    )
    await _pod(cluster, "web-1", "pod-reader")
    manifest = agentrun(
        "reader",
        "[scenario:rbac] what runs here?",
        namespace=ns,
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "kubernetes_list"}}],
        serviceAccountName="pod-reader",
    )
    await cluster.request("POST", cluster.runs_path, json=manifest)
    final = await wait_status(cluster, "reader", phase_in("Succeeded", "Failed"))
    assert (final["phase"], final["result"]) == ("Succeeded", "web-1 runs; the secrets are not mine to read.")

    results = _tool_results(model, "[scenario:rbac]")
    pods = results["toolu_pods"]
    assert not pods.get("is_error"), pods
    listing = json.loads(_text(pods))
    assert (listing["namespace"], listing["count"]) == (ns, 1)
    assert [item["name"] for item in listing["items"]] == ["web-1"]
    # The operator itself may read Secrets; the run's account may not, and the server says so.
    secrets = results["toolu_secrets"]
    assert secrets.get("is_error") is True
    refusal = json.loads(_text(secrets))
    assert (refusal["code"], refusal["recoverable"]) == ("forbidden", True)
    assert refusal["message"] == (
        f"not allowed: {reader} may not list secrets in namespace {ns} (secrets is forbidden: "
        f'User "{reader}" cannot list resource "secrets" in API group "" in the namespace "{ns}")'
    )


@pytest.mark.emulator_only(
    "needs a container log to read: only a kubelet serves one, and the real test server runs none "
    "(the emulator's pod_logs stand in for it)"
)
async def test_the_log_tool_reads_the_tail_as_the_runs_service_account(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    assert cluster.emulator is not None and cluster.kube is not None
    ns = cluster.namespace
    granting = len(cluster.emulator.request_log)
    await grant_service_account(
        cluster,
        "log-reader",
        [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}],
        probe=cluster.path("pods"),
    )
    granted = len(cluster.emulator.request_log)
    await _pod(cluster, "web-1", "log-reader")
    cluster.emulator.set_pod_log(ns, "web-1", "starting\nallocating\nOOMKilled\n")
    manifest = agentrun(
        "logs",
        "[scenario:logs] why did web-1 die?",
        namespace=ns,
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "pod_logs"}}],
        serviceAccountName="log-reader",
    )
    await cluster.request("POST", cluster.runs_path, json=manifest)
    final = await wait_status(cluster, "logs", phase_in("Succeeded", "Failed"))
    assert final["phase"] == "Succeeded", final
    assert _text(_tool_results(model, "[scenario:logs]")["toolu_logs1"]) == "allocating\nOOMKilled\n"
    [read] = [r for r in cluster.emulator.request_log if r.subresource == "log"]
    assert read.impersonate_user == f"system:serviceaccount:{ns}:log-reader"
    assert read.authorization == f"Bearer {cluster.kube.token}"
    assert read.query["tailLines"] == "2"
    # Nothing else the operator sent carried an impersonation header: its own work stays its own
    # (the test's probe of the account's new rights, while granting them, is not the operator's).
    others = [
        r
        for index, r in enumerate(cluster.emulator.request_log)
        if r.impersonate_user and r.subresource != "log" and not granting <= index < granted
    ]
    assert others == []


async def test_the_log_tool_answers_a_pod_no_kubelet_serves_with_a_tool_error_not_a_crash(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    ns = cluster.namespace
    await grant_service_account(
        cluster,
        "log-reader",
        [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}],
        probe=cluster.path("pods"),
    )
    # Bound to a node that has no kubelet (no Node at all): the API server cannot fetch any log.
    await _pod(cluster, "web-1", "log-reader", nodeName=ABSENT_NODE)
    manifest = agentrun(
        "logs",
        "[scenario:logs] why did web-1 die?",
        namespace=ns,
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "pod_logs"}}],
        serviceAccountName="log-reader",
    )
    try:
        await cluster.request("POST", cluster.runs_path, json=manifest)
        final = await wait_status(cluster, "logs", phase_in("Succeeded", "Failed"))
    finally:
        # Without a kubelet a bound pod is never deleted gracefully, and would hold its namespace.
        await cluster.request("DELETE", cluster.path("pods", "web-1"), json={"gracePeriodSeconds": 0})
    assert (final["phase"], final["result"]) == ("Succeeded", "The pod ran out of memory.")
    failed = _tool_results(model, "[scenario:logs]")["toolu_logs1"]
    assert failed.get("is_error") is True
    error = json.loads(_text(failed))
    assert (error["code"], error["recoverable"]) == ("not_found", True)
    assert error["message"] == (
        f'not found: read logs of pod web-1 in namespace {ns} (pods "{ABSENT_NODE}" not found)'
    )
    assert "Traceback" not in operator.logs()
