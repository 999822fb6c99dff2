"""`agentrun run FILE`: the documented exit codes and the final status on stdout."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import HttpError, Reply, Script, text_block, tool_use_block

ROOT = Path(__file__).resolve().parents[2]


async def _agentrun_run(manifest: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrun.cli.main",
        "run",
        str(manifest),
        "-o",
        "json",
        env={**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_example_run_succeeds_with_exit_0_and_prints_status() -> None:
    async with FakeMessagesAPI().running() as api:
        code, out, err = await _agentrun_run(
            ROOT / "examples" / "what-time.yaml", {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
        )
    assert code == 0, err
    status = json.loads(out)
    assert (status["phase"], status["stopReason"], status["iterations"]) == ("Succeeded", "EndTurn", 2)
    assert "tool current_time: ok" in err


async def test_failed_run_exits_1(tmp_path: Path) -> None:
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: denied}\n"
        "spec: {task: '[scenario:denied] hi', model: {name: claude-haiku-4-5}}\n"
    )
    api = FakeMessagesAPI(scripts=[Script("[scenario:denied]", [HttpError(error_type="permission_error")])])
    async with api.running() as server:
        code, out, _ = await _agentrun_run(
            manifest, {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": server.url}
        )
    assert code == 1
    status = json.loads(out)
    assert status["stopReason"] == "ModelError"
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Succeeded"] == "AuthenticationFailed"


async def test_invalid_manifest_exits_2_naming_the_field(tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: bad}\n"
        "spec: {task: hi, limits: {maxIterations: 0}}\n"
    )
    code, out, err = await _agentrun_run(manifest, {"ANTHROPIC_API_KEY": "k"})
    assert code == 2
    assert "spec.limits.maxIterations" in err and out == ""


async def test_a_malformed_context_window_override_exits_2_in_one_line() -> None:
    code, out, err = await _agentrun_run(
        ROOT / "examples" / "what-time.yaml",
        {"ANTHROPIC_API_KEY": "k", "AGENTRUN_CONTEXT_WINDOWS": "claude-haiku-4-5=lots"},
    )
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "error: AGENTRUN_CONTEXT_WINDOWS: context window entry 'claude-haiku-4-5=lots': "
        "expected <model or prefix*>=<tokens, at least 1024>"
    ]


class ThirdPartyMessagesAPI:
    """A Messages API written independently of the project's fake: hand-rolled SSE (or JSON for a
    request without stream: true), one conversation.

    Step 0 asks for the calculator; step 1 first sends an answer cut short (a stream cut before
    message_stop, or half a JSON body), then the answer. Every request body is kept so the test can
    check what the operator sent.
    """

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.cut_served = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        step = sum(1 for m in body["messages"] if m["role"] == "assistant")
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": f"msg_{len(self.bodies)}",
                        "type": "message",
                        "role": "assistant",
                        "model": body["model"],
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 50, "output_tokens": 1},
                    },
                },
            ),
        ]
        if step == 0:
            events += [
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {
                            "type": "tool_use",
                            "id": "call_7f3A",
                            "name": "calculator",
                            "input": {},
                        },
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "input_json_delta", "partial_json": '{"expression": "6 * 7"}'},
                    },
                ),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                (
                    "message_delta",
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                        "usage": {"output_tokens": 9},
                    },
                ),
                ("message_stop", {"type": "message_stop"}),
            ]
        else:
            events += [
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                ),
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": "It is 42"},
                    },
                ),
            ]
            if self.cut_served:
                events += [
                    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                    (
                        "message_delta",
                        {
                            "type": "message_delta",
                            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                            "usage": {"output_tokens": 4},
                        },
                    ),
                    ("message_stop", {"type": "message_stop"}),
                ]
            cut = not self.cut_served
            self.cut_served = True
            if body.get("stream") is not True:
                return await _as_json(request, events, cut=cut)
        if body.get("stream") is not True:
            return await _as_json(request, events, cut=False)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for name, data in events:
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        await response.write_eof()
        return response


async def _as_json(
    request: web.Request, events: list[tuple[str, dict[str, Any]]], *, cut: bool
) -> web.StreamResponse:
    """The same answer as one JSON body, as the API sends it to a request without stream: true; a
    cut answer announces its whole length, sends half and closes the connection."""
    message = dict(events[0][1]["message"])
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for name, data in events[1:]:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[data["index"]]["text"] += delta["text"]
            else:
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
        elif name == "message_delta":
            message.update(data["delta"])
            message["usage"] = {**message["usage"], **data["usage"]}
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    payload = json.dumps({**message, "content": blocks}).encode()
    response = web.StreamResponse(headers={"content-type": "application/json"})
    response.content_length = len(payload)
    await response.prepare(request)
    if not cut:
        await response.write(payload)
        await response.write_eof()
        return response
    await response.write(payload[: len(payload) // 2])
    if request.transport is not None:
        request.transport.close()
    return response


async def test_a_run_against_another_messages_api_server_uses_the_manifests_base_url(tmp_path: Path) -> None:
    server = ThirdPartyMessagesAPI()
    app = web.Application()
    app.router.add_post("/v1/messages", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    manifest = tmp_path / "calc.yaml"
    manifest.write_text(
        "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: calc}\n"
        "spec:\n  task: what is six times seven?\n"
        f"  model: {{name: claude-haiku-4-5, baseURL: '{base_url}'}}\n"
        "  tools: [{builtin: {name: calculator}}]\n"
        "  toolChoice: {type: tool, name: calculator}\n"
    )
    try:
        code, out, err = await _agentrun_run(manifest, {"ANTHROPIC_API_KEY": "k"})
    finally:
        await runner.cleanup()
    assert code == 0, err
    status = json.loads(out)
    assert (status["stopReason"], status["iterations"], status["result"]) == ("EndTurn", 2, "It is 42")
    assert "retry 1" in err and "(connection)" in err
    first, *answers = server.bodies
    assert len(answers) == 2  # the cut stream, then its retry
    assert first["tool_choice"] == {"type": "tool", "name": "calculator"}
    for body in answers:
        assert "tool_choice" not in body
        result = body["messages"][-1]["content"][0]
        assert (result["type"], result["tool_use_id"]) == ("tool_result", "call_7f3A")
        assert "42" in result["content"] and not result.get("is_error")


async def test_a_run_from_an_agent_in_the_same_file_runs_with_the_agents_tools(tmp_path: Path) -> None:
    manifest = tmp_path / "what-day.yaml"
    agent, run = (ROOT / "examples" / name for name in ("agent.yaml", "agentrun-from-agent.yaml"))
    manifest.write_text(f"{agent.read_text()}---\n{run.read_text()}")
    async with FakeMessagesAPI().running() as api:
        code, out, err = await _agentrun_run(
            manifest, {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": api.url}
        )
        first = api.requests[0].body
    assert code == 0, err
    status = json.loads(out)
    assert (status["phase"], status["stopReason"], status["iterations"]) == ("Succeeded", "EndTurn", 2)
    assert "tool current_time: ok" in err
    assert "never guess" in json.dumps(first["system"]) and first["max_tokens"] == 512


async def test_a_run_naming_an_agent_missing_from_the_file_exits_2_in_one_line() -> None:
    code, out, err = await _agentrun_run(
        ROOT / "examples" / "agentrun-from-agent.yaml", {"ANTHROPIC_API_KEY": "k"}
    )
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"error: {ROOT / 'examples' / 'agentrun-from-agent.yaml'}: spec.agentRef: Agent clock is not in the "
        "file; put its Agent document in the same file"
    ]


async def test_a_run_loosening_its_agents_limit_exits_2_naming_the_field(tmp_path: Path) -> None:
    manifest = tmp_path / "loose.yaml"
    manifest.write_text(
        (ROOT / "examples" / "agent.yaml").read_text()
        + "---\napiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: loose}\n"
        "spec: {task: hi, agentRef: {name: clock}, limits: {tokenBudget: 20000}}\n"
    )
    code, out, err = await _agentrun_run(manifest, {"ANTHROPIC_API_KEY": "k"})
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"error: {manifest}: spec.limits.tokenBudget 20000 is above the Agent clock's 10000; "
        "a run can only tighten its Agent's limits"
    ]


async def test_a_run_that_compacted_prints_status_context_with_its_compactions(tmp_path: Path) -> None:
    """docs/long-runs.md: status.context is where compactions show; `agentrun run` prints it too."""
    thoughts = "Checking the arithmetic step by step before the next call. " * 20  # about 400 tokens
    turns = [
        Reply([text_block(thoughts), tool_use_block("calculator", {"expression": f"{i}*7"})])
        for i in range(1, 5)
    ]
    api = FakeMessagesAPI(scripts=[Script("[scenario:long]", [*turns, Reply([text_block("Done.")])])])
    manifest = tmp_path / "long.yaml"
    manifest.write_text(
        "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: long}\n"
        "spec:\n  task: '[scenario:long] multiply'\n  model: {name: claude-haiku-4-5}\n"
        "  tools: [{builtin: {name: calculator}}]\n"
        "  context:\n    contextWindowTokens: 2048\n"
        "    compaction: {thresholdPercent: 50, keepNewestTurns: 1}\n"
    )
    async with api.running() as server:
        code, out, err = await _agentrun_run(
            manifest, {"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": server.url}
        )
    assert code == 0, err
    compactions = err.count("context compacted:")
    assert compactions >= 2, err
    context = json.loads(out)["context"]
    assert context["compactions"] == compactions
    assert 0 < context["lastCompactionIteration"] <= 5
    assert context["tokensBefore"] > context["tokensAfter"] > 0
    assert context["tokensRemoved"] >= context["tokensBefore"] - context["tokensAfter"]


async def test_a_local_run_on_bedrock_signs_with_this_machines_own_aws_credentials(tmp_path: Path) -> None:
    """Locally, Secrets are not read: botocore's default chain finds the AWS_* variables, as it would
    a profile or an SSO sign-in."""
    async with FakeMessagesAPI(demo_brain=True).running() as api:
        key_id, secret = api.aws.new_key()
        manifest = tmp_path / "bedrock.yaml"
        manifest.write_text(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: on-bedrock}\n"
            "spec:\n  task: What time is it?\n"
            "  model:\n    provider: bedrock\n    name: us.anthropic.claude-haiku-4-5-20251001-v1:0\n"
            "    bedrock: {credentialsSecretRef: {name: ignored-locally}}\n"
            "  tools: [{builtin: {name: current_time}}]\n"
        )
        env = {
            "AWS_ACCESS_KEY_ID": key_id,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": api.aws.region,
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "ANTHROPIC_BEDROCK_BASE_URL": api.url,
        }
        code, out, err = await _agentrun_run(manifest, env)
        signed = api.aws.signed_requests
    assert code == 0, err
    assert json.loads(out)["phase"] == "Succeeded"
    assert "credentialsSecretRef is ignored locally" in err
    assert signed == 2
