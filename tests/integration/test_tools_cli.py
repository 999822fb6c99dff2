"""`agentrun run` with webhook, MCP and Kubernetes tools against servers started by the test.

The Kubernetes scenario runs against the test's cluster (the emulator, or a real API server with
`--real-cluster`): the CLI reads as the run's service account, whose Role the test creates.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.clusters import TestCluster
from tests.support.rbac import grant_service_account
from tests.unit.tools.servers import Answer, WebhookReceiver, mcp_serving


async def _agentrun_run(manifest: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "KUBECONFIG"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrun.cli.main",
        "run",
        str(manifest),
        "-o",
        "json",
        *args,
        env={**base, "HOME": str(manifest.parent), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _manifest(path: Path, name: str, spec: dict[str, Any], namespace: str | None = None) -> Path:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    path.write_text(
        yaml.safe_dump(
            {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "metadata": metadata, "spec": spec}
        )
    )
    return path


async def test_agentrun_run_calls_a_webhook_and_an_mcp_server(tmp_path: Path) -> None:
    steps = [
        Reply([tool_use_block("notify", {"text": 42}, id="toolu_bad")]),
        Reply(
            [
                tool_use_block("notify", {"text": "hello"}, id="toolu_w1"),
                tool_use_block("inv_count_items", {"warehouse": "north"}, id="toolu_m1"),
            ]
        ),
        Reply([text_block("Done: 17 items.")]),
    ]
    api = FakeMessagesAPI(scripts=[Script("[scenario:cli-tools]", steps)])
    receiver = WebhookReceiver(
        answers=[Answer(503, {"message": "warming up"})], default=Answer(200, {"ok": True})
    )
    async with api.running() as model, receiver.running(), mcp_serving() as mcp:
        spec = {
            "task": "[scenario:cli-tools] go",
            "model": {"name": "claude-haiku-4-5"},
            "tools": [
                {
                    "http": {
                        "name": "notify",
                        "description": "Notify the team.",
                        "url": f"{receiver.url}/notify",
                        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
                    }
                },
                {"mcp": {"name": "inv", "url": mcp.url, "allowedTools": ["count_items"]}},
            ],
        }
        code, out, err = await _agentrun_run(
            _manifest(tmp_path / "run.yaml", "cli-tools", spec),
            {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": model.url},
        )
    assert code == 0, err
    status = json.loads(out)
    assert (status["phase"], status["result"]) == ("Succeeded", "Done: 17 items.")
    assert "tool notify: error invalid_input" in err
    # The schema-invalid call never reached the receiver; the valid one was retried after a 503
    # with the same Idempotency-Key.
    assert [r.body for r in receiver.received] == [{"text": "hello"}, {"text": "hello"}]
    assert {r.headers["Idempotency-Key"] for r in receiver.received} == {"local-cli-tools:toolu_w1"}
    third = [m for m in model.requests if "[scenario:cli-tools]" in json.dumps(m.body)][2]
    results = {b["tool_use_id"]: b for b in third.body["messages"][-1]["content"]}
    assert results["toolu_m1"]["content"] == "17"


async def test_agentrun_run_reads_header_secrets_and_kubernetes_from_kubeconfig(
    tmp_path: Path, cluster: TestCluster
) -> None:
    ns = cluster.namespace
    steps = [
        Reply([tool_use_block("notify", {"text": "hi"}, id="toolu_1")]),
        Reply(
            [
                tool_use_block("kubernetes_list", {"resource": "pods"}, id="toolu_2"),
                tool_use_block("kubernetes_list", {"resource": "secrets"}, id="toolu_3"),
            ]
        ),
        Reply([text_block("ok")]),
    ]
    api = FakeMessagesAPI(scripts=[Script("[scenario:cli-kube]", steps)])
    agent = await grant_service_account(
        cluster,
        "agent",
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        probe=cluster.path("pods"),
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1"},
        "spec": {"serviceAccountName": "agent", "containers": [{"name": "app", "image": "nginx"}]},
    }
    await cluster.request("POST", cluster.path("pods"), json=pod)
    headers = base64.b64encode(b'{"X-Token": "abc"}').decode()
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hook"}, "data": {"h": headers}}
    await cluster.request("POST", cluster.path("secrets"), json=secret)
    async with api.running() as model, WebhookReceiver().running() as receiver:
        spec: dict[str, Any] = {
            "task": "[scenario:cli-kube] go",
            "model": {"name": "claude-haiku-4-5"},
            "serviceAccountName": "agent",
            "tools": [
                {
                    "http": {
                        "name": "notify",
                        "description": "d",
                        "url": f"{receiver.url}/n",
                        "headersFrom": {"name": "hook", "key": "h"},
                    }
                },
                {"builtin": {"name": "kubernetes_list"}},
            ],
        }
        env = {
            "ANTHROPIC_API_KEY": "k",
            "ANTHROPIC_BASE_URL": model.url,
            "KUBECONFIG": str(cluster.kubeconfig),
        }
        manifest = _manifest(tmp_path / "run.yaml", "cli-kube", spec)
        code, out, err = await _agentrun_run(manifest, env, "--namespace", ns)
        assert code == 0, err
        assert receiver.received[0].headers["X-Token"] == "abc"
        third = [m for m in model.requests if "[scenario:cli-kube]" in json.dumps(m.body)][2]
        results = {b["tool_use_id"]: b for b in third.body["messages"][-1]["content"]}
        # Listed in the run's namespace, as its service account: the account may list pods there and
        # is refused Secrets (which the kubeconfig's own identity could read).
        assert not results["toolu_2"].get("is_error"), results["toolu_2"]
        listing = json.loads(results["toolu_2"]["content"])
        assert (listing["resource"], listing["namespace"], listing["count"]) == ("pods", ns, 1)
        assert [item["name"] for item in listing["items"]] == ["web-1"]
        assert results["toolu_3"].get("is_error") is True
        refusal = json.loads(results["toolu_3"]["content"])
        assert refusal["code"] == "forbidden"
        assert refusal["message"] == (
            f"not allowed: {agent} may not list secrets in namespace {ns} (secrets is forbidden: "
            f'User "{agent}" cannot list resource "secrets" in API group "" in the namespace "{ns}")'
        )

        # A Secret the cluster does not have is a clear error before anything runs.
        tools = [{"http": {**spec["tools"][0]["http"], "headersFrom": {"name": "no-such-hook", "key": "h"}}}]
        missing = _manifest(tmp_path / "missing.yaml", "cli-kube", {**spec, "tools": tools}, ns)
        code, out, err = await _agentrun_run(missing, env)
    assert code == 2 and out == ""
    assert f"Secret {ns}/no-such-hook with key 'h' (spec.tools[0].http.headersFrom) does not exist" in err


async def test_agentrun_run_without_a_cluster_says_which_tools_need_one(tmp_path: Path) -> None:
    spec = {
        "task": "x",
        "tools": [
            {
                "http": {
                    "name": "n",
                    "description": "d",
                    "url": "http://127.0.0.1:9/",
                    "headersFrom": {"name": "s"},
                }
            },
            {"builtin": {"name": "pod_logs"}},
        ],
    }
    code, out, err = await _agentrun_run(
        _manifest(tmp_path / "run.yaml", "no-cluster", spec),
        {"ANTHROPIC_API_KEY": "k", "KUBECONFIG": str(tmp_path / "absent.yaml")},
    )
    assert code == 2 and out == ""
    assert "spec.tools[0].http.headersFrom, spec.tools[1].builtin (pod_logs) need a Kubernetes cluster" in err
    assert "KUBECONFIG" in err
