"""Tools through the real operator process: header Secrets that appear late, impersonated Kubernetes reads."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.sandbox.kube_api import KubeAPI as KubeEmulator
from agentrun.sandbox.messages_api import FakeMessagesAPI
from agentrun.sandbox.messages_script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.kube_requests import request
from tests.support.operator_process import OperatorProcess, running_operator
from tests.unit.tools.servers import Answer, WebhookReceiver

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
RUNS = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
API_KEY = "sk-ant-tools-integration-0123456789"
HOOK_TOKEN = "hook-token-s3cret-abcdef"


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
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: KubeEmulator, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_SECRET_RETRY_SECONDS": "0.5",
    }
    async with running_operator(Path(cluster.kubeconfig_path), tmp_path / "operator.log", env) as process:
        yield process


async def _wait_status(
    cluster: KubeEmulator, name: str, phases: set[str], timeout: float = 30.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = (await request(cluster, "GET", f"{RUNS}/{name}")).get("status") or {}
        if status.get("phase") in phases:
            return status
        await asyncio.sleep(0.2)
    raise AssertionError(f"{name} never reached {phases}: {status}")


async def test_a_webhook_header_secret_created_later_takes_the_run_from_pending_to_succeeded(
    cluster: KubeEmulator, operator: OperatorProcess
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
            model={"name": "claude-haiku-4-5"},
            tools=[{"http": webhook}],
        )
        created = await request(cluster, "POST", RUNS, json=manifest)
        pending = await _wait_status(cluster, "notify", {"Pending", "Succeeded", "Failed"})
        assert pending["phase"] == "Pending"
        assert {c["type"]: c["reason"] for c in pending["conditions"]}["Succeeded"] == "SecretNotFound"
        assert "default/hook-headers" in pending["message"]
        assert "spec.tools[0].http.headersFrom" in pending["message"]
        assert receiver.received == []

        headers = json.dumps({"Authorization": f"Bearer {HOOK_TOKEN}"})
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hook-headers", "namespace": "default"},
            "data": {"headers": base64.b64encode(headers.encode()).decode()},
        }
        await request(cluster, "POST", "/api/v1/namespaces/default/secrets", json=secret)
        final = await _wait_status(cluster, "notify", {"Succeeded", "Failed"})
    assert (final["phase"], final["result"]) == ("Succeeded", "Notified.")
    [received] = receiver.received
    assert received.body == {"text": "deploy finished"}
    assert received.headers["Authorization"] == f"Bearer {HOOK_TOKEN}"
    assert received.headers["Idempotency-Key"] == f"{created['metadata']['uid']}:toolu_hook1"
    assert HOOK_TOKEN not in operator.logs() and HOOK_TOKEN not in json.dumps(final)


async def test_kubernetes_tools_in_the_operator_read_as_the_runs_service_account(
    cluster: KubeEmulator, operator: OperatorProcess
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
    }
    cluster.emulator.create_object("pods", pod)
    cluster.emulator.set_pod_log("default", "web-1", "starting\nallocating\nOOMKilled\n")
    manifest = agentrun(
        "logs",
        "[scenario:logs] why did web-1 die?",
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "pod_logs"}}],
        serviceAccountName="log-reader",
    )
    await request(cluster, "POST", RUNS, json=manifest)
    final = await _wait_status(cluster, "logs", {"Succeeded", "Failed"})
    assert final["phase"] == "Succeeded", final
    [read] = [r for r in cluster.emulator.request_log if r.subresource == "log"]
    assert read.impersonate_user == "system:serviceaccount:default:log-reader"
    assert read.authorization == f"Bearer {cluster.token}"
    assert read.query["tailLines"] == "2"
    # Nothing else the operator sent carried an impersonation header: its own work stays its own.
    others = [r for r in cluster.emulator.request_log if r.impersonate_user and r.subresource != "log"]
    assert others == []
