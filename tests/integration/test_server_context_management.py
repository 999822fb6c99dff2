"""Server-side context management through the real operator: runs that leave clearing or compaction
to the Messages API (spec.context strategy Server) succeed with the API's edits applied.

The fake Messages API does what the betas do: it clears old tool results in what the model reads,
and compacts a request past the trigger into a compaction block that must come back verbatim
in every later request (it answers 400 otherwise, which would fail the run).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.loop.windowing import SUMMARY_REQUEST
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.integration.test_context_management import _events, _finished
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.unit.tools.servers import Answer, WebhookReceiver

API_KEY = "sk-ant-server-context-0123456789"
LOG = "E0412 OOMKilled: container web exceeded its memory limit\n" * 340  # about 20 KB: 5,000 tokens
CALLS = 5
CLEAR, COMPACT = "[scenario:server-clear]", "[scenario:server-compact]"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    steps = [Reply([tool_use_block("fetch_log", {"pod": f"web-{i}"})]) for i in range(CALLS)]
    answer = Reply([text_block("Every web pod was OOMKilled.")])
    api = FakeMessagesAPI(
        scripts=[Script(CLEAR, [*steps, answer]), Script(COMPACT, [*steps, answer])],
        require_api_key=API_KEY,
        demo_brain=False,
    )
    async with api.running() as server:
        yield server


def _manifest(cluster: TestCluster, name: str, tag: str, url: str, context: dict[str, Any]) -> dict[str, Any]:
    webhook = {
        "name": "fetch_log",
        "description": "Returns the log of a pod.",
        "url": url,
        "inputSchema": {"type": "object", "properties": {"pod": {"type": "string"}}},
    }
    return agentrun(
        name,
        f"{tag} find out why the web pods restart",
        namespace=cluster.namespace,
        model={"name": "fake-server-context-1"},
        tools=[{"http": webhook}],
        limits={"maxToolResultChars": 60_000},
        context=context,
    )


async def test_runs_that_leave_clearing_or_compaction_to_the_api_succeed_with_its_edits_applied(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    prices = tmp_path / "prices.yaml"  # the operator's own model: its price table knows the name
    prices.write_text('prices: [{model: "fake-server-context-1", input: 1, output: 5}]\n')
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_PRICE_FILE": str(prices),
        "AGENTRUN_STATUS_INTERVAL_SECONDS": "0",
    }
    clearing = {"clearToolResults": {"strategy": "Server", "keepNewest": 2, "batch": 1}}
    compacting = {
        "clearToolResults": {"enabled": False},
        "compaction": {"strategy": "Server", "thresholdPercent": 50},
        "contextWindowTokens": 24_000,  # compacted on the server at 12,000 input tokens
    }
    async with (
        cluster.operator(tmp_path / "operator.log", env),
        WebhookReceiver(default=Answer(200, {"log": LOG})).running() as receiver,
    ):
        url = f"{receiver.url}/logs"
        await cluster.request(
            "POST", cluster.runs_path, json=_manifest(cluster, "clears", CLEAR, url, clearing)
        )
        await cluster.request(
            "POST", cluster.runs_path, json=_manifest(cluster, "compacts", COMPACT, url, compacting)
        )
        cleared = await _finished(cluster, "clears")
        compacted = await _finished(cluster, "compacts")
    assert model.protocol_errors == []
    for status in (cleared, compacted):
        assert (status["phase"], status["stopReason"]) == ("Succeeded", "EndTurn"), status.get("message")
        assert status["result"] == "Every web pod was OOMKilled."

    # Clearing: asked of the API, done by the API, not by the operator.
    requests = model.requests_for(CLEAR)
    assert len(requests) == CALLS + 1
    for request in requests:
        assert request.headers["anthropic-beta"] == "context-management-2025-06-27"
        assert [e["type"] for e in request.body["context_management"]["edits"]] == [
            "clear_tool_uses_20250919"
        ]
        assert "cleared to save context" not in json.dumps(request.body)
    applied = [edits for script, edits, _ in model.context_edits if script == CLEAR and edits]
    assert applied and sum(e["cleared_tool_uses"] for edits in applied for e in edits) >= CALLS - 2
    assert (cleared.get("context") or {}).get("compactions", 0) == 0

    # Compaction: on the server, visible like the operator's own, and no summary request of its own.
    requests = model.requests_for(COMPACT)
    assert len(requests) == CALLS + 1
    assert not any(SUMMARY_REQUEST in json.dumps(r.body) for r in requests)
    assert requests[0].body["context_management"]["edits"] == [
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 12_000}}
    ]
    served = sum(1 for script, _, compacted_now in model.context_edits if script == COMPACT and compacted_now)
    assert served >= 1
    # Every compaction block is still in the last request, first in its assistant message.
    kept = [
        m["content"][0]
        for m in requests[-1].body["messages"]
        if m["role"] == "assistant" and m["content"][0].get("type") == "compaction"
    ]
    assert len(kept) == served
    context = compacted["context"]
    assert context["compactions"] == served
    assert context["tokensAfter"] < context["tokensBefore"]
    [event] = await _events(cluster, "compacts", "ContextCompacted")
    assert event["type"] == "Normal" and event["count"] == served
