"""Extended thinking and conversation caching, end to end: the real operator, the scenario's API server
and the fake Messages API, which refuses any follow-up that lost or altered a thinking block."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    Reply,
    Script,
    ScriptUsage,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request, wait_finished
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-thinking-secret-0123456789"
MARKER = "[scenario:thinking-two-tool-turns]"
MODEL = "claude-sonnet-4-6"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                MARKER,
                [
                    Reply(
                        [
                            thinking_block("Two numbers to work out; the calculator first."),
                            redacted_thinking_block("EmwKAhgBEgy3va3pzixRedacted"),
                            tool_use_block("calculator", {"expression": "17*23"}, id="toolu_think1"),
                        ],
                        usage=ScriptUsage(400, 220, cache_creation_input_tokens=1500),
                    ),
                    Reply(
                        [
                            thinking_block("391. Now add the spare four."),
                            tool_use_block("calculator", {"expression": "391+4"}, id="toolu_think2"),
                        ],
                        usage=ScriptUsage(
                            60, 180, cache_read_input_tokens=1500, cache_creation_input_tokens=450
                        ),
                    ),
                    Reply(
                        [thinking_block("395 it is."), text_block("There are 395 pods.")],
                        usage=ScriptUsage(
                            50, 90, cache_read_input_tokens=1950, cache_creation_input_tokens=100
                        ),
                    ),
                ],
            )
        ],
        require_api_key=API_KEY,
        demo_brain=False,
    )
    async with api.running() as server:
        yield server


def _cache_marks(body: dict[str, Any]) -> int:
    text = str({key: body.get(key) for key in ("system", "tools", "messages")})
    return text.count("'cache_control'")


async def test_a_thinking_run_across_two_tool_turns_succeeds_with_its_thinking_sent_back_unchanged(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    manifest = agentrun(
        "thinks",
        f"{MARKER} how many pods?",
        namespace=cluster.namespace,
        systemPrompt="Count carefully.",
        model={"name": MODEL, "maxTokens": 8192, "thinking": {"budgetTokens": 4096}},
        tools=[{"builtin": {"name": "calculator"}}],
    )
    await request(cluster, "POST", cluster.runs_path, json=manifest)
    status = (await wait_finished(cluster, "thinks"))["status"]
    assert (status["phase"], status["stopReason"], status["result"]) == (
        "Succeeded",
        "EndTurn",
        "There are 395 pods.",
    )
    assert (status["iterations"], status["toolCalls"]) == (3, 2)
    usage = status["usage"]
    # Thinking is billed as output: every scripted output token, thinking included, is counted.
    assert (usage["inputTokens"], usage["outputTokens"]) == (510, 490)
    assert (usage["cacheReadInputTokens"], usage["cacheCreationInputTokens"]) == (3450, 2050)

    assert model.protocol_errors == []
    requests = model.requests_for(MARKER)
    assert [r.outcome for r in requests] == ["reply", "reply", "reply"]
    for sent in requests:
        assert sent.body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
        assert "interleaved-thinking-2025-05-14" in sent.headers["anthropic-beta"]
        assert 3 <= _cache_marks(sent.body) <= 4  # system, tools and the conversation, never more than 4
    first_turn = requests[2].body["messages"][1]["content"]
    assert [b["type"] for b in first_turn] == ["thinking", "redacted_thinking", "tool_use"]
    assert first_turn[1]["data"] == "EmwKAhgBEgy3va3pzixRedacted"

    scrape = await operator.scrape()
    labels = f'model="{MODEL}",namespace="{cluster.namespace}"'
    assert f"agentrun_prompt_tokens_total{{{labels}}} {510.0 + 3450 + 2050}" in scrape
    assert f"agentrun_prompt_cached_tokens_total{{{labels}}} 3450.0" in scrape
    assert API_KEY not in scrape and API_KEY not in operator.logs()
