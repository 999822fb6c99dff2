"""Webhook and MCP tools driven by the real loop: real SDK, fake Messages API, real tool servers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import anthropic
from prometheus_client import CollectorRegistry

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.events import ToolCallFinished
from agentrun.loop.running import run_loop
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun.model.anthropic_calling import AnthropicModel
from agentrun.model.pricing import PriceTable
from agentrun.tools.registry import open_tools
from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from agentrun_sandbox.messages.script import Reply, Script, Step, text_block, tool_use_block
from tests.support.loop_harness import Fanout, Recorder
from tests.unit.tools.environment import StaticEnvironment
from tests.unit.tools.servers import Answer, WebhookReceiver, mcp_serving

MARKER = "[scenario:tools]"
WEBHOOK = {
    "name": "open_ticket",
    "description": "Opens a ticket.",
    "inputSchema": {
        "type": "object",
        "properties": {"summary": {"type": "string", "minLength": 5}},
        "required": ["summary"],
    },
}


async def _run(
    steps: Sequence[Step], tools_spec: list[dict[str, Any]], registry: CollectorRegistry
) -> tuple[Outcome, Recorder, list[RecordedRequest]]:
    spec = AgentRunSpec.model_validate(
        {"task": f"{MARKER} do it", "model": {"name": "claude-haiku-4-5"}, "tools": tools_spec}
    )
    recorder = Recorder()
    clock = SystemClock()
    metrics = MetricsObserver(Metrics(registry), namespace="default", started_monotonic=clock.monotonic())
    api = FakeMessagesAPI(scripts=[Script(MARKER, steps)], demo_brain=False)
    async with api.running() as server, open_tools(spec, StaticEnvironment(run_uid="uid-7")) as tools:
        client = anthropic.AsyncAnthropic(api_key="sk-test", base_url=server.url, max_retries=0, timeout=30)
        try:
            outcome = await run_loop(
                LoopConfig.from_spec(spec, run_id="uid-7"),
                model=AnthropicModel(client),
                tools=tools,
                observer=Fanout(recorder, metrics),
                clock=clock,
                pricer=PriceTable(),
                cancel=asyncio.Event(),
            )
        finally:
            await client.close()
        return outcome, recorder, list(server.requests)


def _tool_results(request: RecordedRequest) -> list[dict[str, Any]]:
    return [b for b in request.body["messages"][-1]["content"] if b.get("type") == "tool_result"]


async def test_the_model_calls_a_webhook_fixes_its_invalid_input_and_finishes() -> None:
    registry = CollectorRegistry()
    async with WebhookReceiver(default=Answer(200, {"ticket": "T-1"})).running() as receiver:
        outcome, recorder, requests = await _run(
            [
                Reply([tool_use_block("open_ticket", {"summary": "x"}, id="toolu_bad")]),
                Reply([tool_use_block("open_ticket", {"summary": "disk full on node-3"}, id="toolu_good")]),
                Reply([text_block("Opened T-1.")]),
            ],
            [{"http": {**WEBHOOK, "url": f"{receiver.url}/tickets"}}],
            registry,
        )
    assert outcome.stop_reason is StopReason.END_TURN and outcome.result == "Opened T-1."
    [invalid] = _tool_results(requests[1])
    assert invalid["is_error"] is True and json.loads(invalid["content"])["code"] == "invalid_input"
    [valid] = _tool_results(requests[2])
    assert valid["tool_use_id"] == "toolu_good" and json.loads(valid["content"]) == {"ticket": "T-1"}
    # Only the valid call reached the receiver, keyed by run uid and tool_use id.
    assert [r.body for r in receiver.received] == [{"summary": "disk full on node-3"}]
    assert receiver.received[0].headers["Idempotency-Key"] == "uid-7:toolu_good"
    # Every call was timed and counted, failed ones under their error code.
    traces = [e.trace for e in recorder.of(ToolCallFinished)]
    assert [(t.name, t.ok, t.error_code) for t in traces] == [
        ("open_ticket", False, "invalid_input"),
        ("open_ticket", True, None),
    ]
    assert (
        registry.get_sample_value("agentrun_tool_calls_total", {"tool": "open_ticket", "outcome": "ok"}) == 1
    )
    assert (
        registry.get_sample_value(
            "agentrun_tool_calls_total", {"tool": "open_ticket", "outcome": "invalid_input"}
        )
        == 1
    )
    assert (
        registry.get_sample_value("agentrun_tool_call_duration_seconds_count", {"tool": "open_ticket"}) == 2
    )


async def test_a_401_from_a_webhook_ends_the_run_with_fatal_tool_error() -> None:
    async with WebhookReceiver(default=Answer(401, {"message": "bad token"})).running() as receiver:
        outcome, _, requests = await _run(
            [Reply([tool_use_block("open_ticket", {"summary": "disk full"}, id="toolu_1")])],
            [{"http": {**WEBHOOK, "url": f"{receiver.url}/tickets"}}],
            CollectorRegistry(),
        )
    assert outcome.stop_reason is StopReason.FATAL_TOOL_ERROR
    assert "unauthorized" in outcome.message
    assert len(requests) == 1


async def test_the_model_calls_an_mcp_tool_under_its_prefixed_name() -> None:
    registry = CollectorRegistry()
    async with mcp_serving() as mcp:
        outcome, _, requests = await _run(
            [
                Reply([tool_use_block("inv_count_items", {"warehouse": "north"}, id="toolu_m1")]),
                Reply([tool_use_block("inv_reserve", {"warehouse": "north", "amount": 99}, id="toolu_m2")]),
                Reply([text_block("17 items; reserving 99 failed.")]),
            ],
            [{"mcp": {"name": "inv", "url": mcp.url, "allowedTools": ["count_items", "reserve"]}}],
            registry,
        )
    assert outcome.stop_reason is StopReason.END_TURN
    offered = [t["name"] for t in requests[0].body["tools"]]
    assert offered == ["inv_count_items", "inv_reserve"]
    assert [t["name"] for t in requests[2].body["tools"]] == offered  # fixed for the whole run
    assert _tool_results(requests[1])[0]["content"] == "17"
    failed = _tool_results(requests[2])[0]
    assert failed["is_error"] is True and "only 10 items can be reserved" in failed["content"]
    assert (
        registry.get_sample_value(
            "agentrun_tool_calls_total", {"tool": "inv_reserve", "outcome": "tool_error"}
        )
        == 1
    )
