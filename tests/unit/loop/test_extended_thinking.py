"""Extended thinking through the real SDK and adapter: what the request asks for, and thinking blocks
that go back unchanged (the fake Messages API refuses a follow-up that lost or altered them)."""

from __future__ import annotations

from typing import Any

from agentrun.api.stops import StopReason
from agentrun_sandbox.messages.script import (
    Reply,
    ScriptUsage,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)
from tests.support.loop_harness import FakeTool, run_scripted

THINKING = {"maxTokens": 8192, "thinking": {"budgetTokens": 2048}}
BETA = "interleaved-thinking-2025-05-14"


def _thinking_turns() -> list[Reply]:
    return [
        Reply(
            [
                thinking_block("Which pods? Look first."),
                redacted_thinking_block("EmwKAhgBEgy3va3pzix"),
                tool_use_block("t", {"q": "pods"}, id="toolu_1"),
            ],
            usage=ScriptUsage(100, 300),
        ),
        Reply(
            [thinking_block("Now the logs."), tool_use_block("t", {"q": "logs"}, id="toolu_2")],
            usage=ScriptUsage(200, 250),
        ),
        Reply([thinking_block("Enough to answer."), text_block("All healthy.")], usage=ScriptUsage(300, 150)),
    ]


def _without_marks(message: dict[str, Any]) -> dict[str, Any]:
    return {
        **message,
        "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in message["content"]],
    }


async def test_thinking_asks_for_a_budget_and_interleaved_thinking_when_tools_are_offered() -> None:
    run = await run_scripted(_thinking_turns(), tools=[FakeTool("t")], spec={"model": THINKING})
    first = run.requests[0]
    assert first.body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first.body["max_tokens"] == 8192
    assert BETA in first.headers["anthropic-beta"]
    assert "temperature" not in first.body


async def test_signed_and_redacted_thinking_goes_back_unchanged_across_two_tool_turns() -> None:
    run = await run_scripted(_thinking_turns(), tools=[FakeTool("t")], spec={"model": THINKING})
    assert run.outcome.stop_reason is StopReason.END_TURN and run.outcome.result == "All healthy."
    first_answer = run.requests[1].body["messages"][1]
    assert [b["type"] for b in first_answer["content"]] == ["thinking", "redacted_thinking", "tool_use"]
    assert first_answer["content"][0]["signature"]
    # The third request resends both earlier turns exactly as the second did.
    third = run.requests[2].body["messages"]
    assert third[1] == first_answer
    assert _without_marks(third[3])["content"][0]["thinking"] == "Now the logs."
    stored = [m for m in run.recorder.transcript() if m["role"] == "assistant"]
    assert stored[0] == _without_marks(first_answer)


async def test_thinking_tokens_count_as_output_tokens_in_usage() -> None:
    run = await run_scripted(_thinking_turns(), tools=[FakeTool("t")], spec={"model": THINKING})
    usage = run.finished.progress.usage
    assert (usage.input_tokens, usage.output_tokens) == (600, 700)


async def test_without_tools_there_is_nothing_to_interleave_and_no_beta_header() -> None:
    run = await run_scripted([Reply([thinking_block("Easy."), text_block("4")])], spec={"model": THINKING})
    assert run.outcome.result == "4"
    assert "anthropic-beta" not in run.requests[0].headers
    assert run.requests[0].body["thinking"]["budget_tokens"] == 2048


async def test_interleaving_can_be_turned_off_and_then_no_beta_header_is_sent() -> None:
    off = {"model": {**THINKING, "thinking": {"budgetTokens": 2048, "interleaved": False}}}
    run = await run_scripted(_thinking_turns(), tools=[FakeTool("t")], spec=off)
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert all("anthropic-beta" not in r.headers for r in run.requests)
    assert all(r.body["thinking"] == {"type": "enabled", "budget_tokens": 2048} for r in run.requests)


async def test_without_thinking_the_request_asks_for_none() -> None:
    run = await run_scripted([Reply([text_block("4")])])
    assert "thinking" not in run.requests[0].body


async def test_a_temperature_of_one_is_sent_with_thinking() -> None:
    run = await run_scripted(
        [Reply([thinking_block("Easy."), text_block("4")])], spec={"model": {**THINKING, "temperature": 1}}
    )
    assert run.requests[0].body["temperature"] == 1


async def test_a_temperature_reaches_the_api_although_the_sdk_has_no_argument_for_it() -> None:
    run = await run_scripted([Reply([text_block("4")])], spec={"model": {"temperature": 0.25}})
    assert run.outcome.result == "4"
    assert run.requests[0].body["temperature"] == 0.25
