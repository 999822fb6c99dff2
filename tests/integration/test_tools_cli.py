"""`agentrun run` with webhook, MCP and Kubernetes tools against servers started by the test."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from agentrun.sandbox.kube_api import KubeAPI as KubeEmulator
from agentrun.sandbox.messages_api import FakeMessagesAPI
from agentrun.sandbox.messages_script import Reply, Script, text_block, tool_use_block
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


async def test_agentrun_run_reads_header_secrets_and_kubernetes_from_kubeconfig(tmp_path: Path) -> None:
    steps = [
        Reply([tool_use_block("notify", {"text": "hi"}, id="toolu_1")]),
        Reply([tool_use_block("kubernetes_list", {"resource": "pods"}, id="toolu_2")]),
        Reply([text_block("ok")]),
    ]
    api = FakeMessagesAPI(scripts=[Script("[scenario:cli-kube]", steps)])
    async with (
        KubeEmulator.running() as cluster,
        api.running() as model,
        WebhookReceiver().running() as receiver,
    ):
        cluster.emulator.create_object(
            "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
        )
        headers = base64.b64encode(b'{"X-Token": "abc"}').decode()
        cluster.emulator.create_object(
            "secrets",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "hook", "namespace": "team-a"},
                "data": {"h": headers},
            },
        )
        spec = {
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
        manifest = _manifest(tmp_path / "run.yaml", "cli-kube", spec)
        code, out, err = await _agentrun_run(
            manifest,
            {
                "ANTHROPIC_API_KEY": "k",
                "ANTHROPIC_BASE_URL": model.url,
                "KUBECONFIG": str(cluster.kubeconfig_path),
            },
            "--namespace",
            "team-a",
        )
        assert code == 0, err
        assert receiver.received[0].headers["X-Token"] == "abc"
        listing = [r for r in cluster.emulator.request_log if r.resource == "pods"]
        assert [(r.namespace, r.impersonate_user) for r in listing] == [
            ("team-a", "system:serviceaccount:team-a:agent")
        ]

        # A Secret the cluster does not have is a clear error before anything runs.
        missing = _manifest(
            tmp_path / "missing.yaml", "cli-kube", {**spec, "tools": spec["tools"][:1]}, "default"
        )
        code, out, err = await _agentrun_run(
            missing,
            {
                "ANTHROPIC_API_KEY": "k",
                "ANTHROPIC_BASE_URL": model.url,
                "KUBECONFIG": str(cluster.kubeconfig_path),
            },
        )
    assert code == 2 and out == ""
    assert "Secret default/hook with key 'h' (spec.tools[0].http.headersFrom) does not exist" in err


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
