"""Extended thinking in the fake Messages API, as the real SDK sees it: thinking and redacted_thinking
blocks streamed like the real API's, and follow-up requests refused when they lose or alter them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    Reply,
    Script,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)
from agentrun_sandbox.messages.script_files import parse_scripts, scripts_to_data

MODEL = "claude-sonnet-4-6"
MARKER = "[scenario:thinking]"
TOOL = {"name": "lookup", "description": "Look something up.", "input_schema": {"type": "object"}}
THINKING = {"type": "enabled", "budget_tokens": 2048}
TASK = {"role": "user", "content": f"{MARKER} find it"}


@pytest.fixture
async def api() -> AsyncIterator[FakeMessagesAPI]:
    script = Script(
        MARKER,
        [
            Reply(
                [
                    thinking_block("I should look it up first."),
                    redacted_thinking_block("EmwKAhgBEgy3va3pzix"),
                    tool_use_block("lookup", {"q": "it"}, id="toolu_T1"),
                ]
            ),
            Reply([thinking_block("The result answers it."), text_block("Found it.")]),
        ],
    )
    async with FakeMessagesAPI([script], demo_brain=False).running() as server:
        yield server


@pytest.fixture
async def client(api: FakeMessagesAPI) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(api_key="sk-test", base_url=api.url, max_retries=0) as sdk:
        yield sdk


async def _first_turn(client: anthropic.AsyncAnthropic) -> list[dict[str, Any]]:
    message = await client.messages.create(
        model=MODEL, max_tokens=4096, thinking=THINKING, tools=[TOOL], messages=[TASK]
    )
    return [block.model_dump(exclude_none=True) for block in message.content]


def _follow_up(assistant: list[dict[str, Any]]) -> list[dict[str, Any]]:
    result = {"type": "tool_result", "tool_use_id": "toolu_T1", "content": "it is here"}
    return [TASK, {"role": "assistant", "content": assistant}, {"role": "user", "content": [result]}]


async def test_thinking_is_streamed_as_thinking_and_signature_deltas(
    client: anthropic.AsyncAnthropic,
) -> None:
    stream = await client.messages.create(
        model=MODEL, max_tokens=4096, thinking=THINKING, tools=[TOOL], messages=[TASK], stream=True
    )
    deltas = [event.delta.type async for event in stream if event.type == "content_block_delta"]
    assert deltas.index("signature_delta") > deltas.index("thinking_delta")
    assert deltas.count("signature_delta") == 1  # only the signed block; redacted thinking has no deltas


async def test_served_thinking_is_signed_and_redacted_thinking_is_served_as_scripted(
    client: anthropic.AsyncAnthropic,
) -> None:
    thinking, redacted, call = await _first_turn(client)
    assert thinking["thinking"] == "I should look it up first." and thinking["signature"]
    assert redacted == {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    assert call["id"] == "toolu_T1"


async def test_a_follow_up_that_keeps_every_thinking_block_unchanged_is_answered(
    client: anthropic.AsyncAnthropic, api: FakeMessagesAPI
) -> None:
    served = await _first_turn(client)
    answer = await client.messages.create(
        model=MODEL, max_tokens=4096, thinking=THINKING, tools=[TOOL], messages=_follow_up(served)
    )
    assert [block.type for block in answer.content] == ["thinking", "text"]
    assert api.protocol_errors == []


@pytest.mark.parametrize(
    ("spoil", "error"),
    [
        (lambda blocks: blocks[2:], r"content\.0\.type: Expected `thinking`, but found `tool_use`"),
        (lambda blocks: [blocks[0], blocks[2]], r"content\.1\.type: Expected `redacted_thinking`, but found"),
        (
            lambda blocks: [{**blocks[0], "thinking": "I changed my mind."}, *blocks[1:]],
            "Invalid `signature` in `thinking` block",
        ),
        (
            lambda blocks: [blocks[0], {**blocks[1], "data": "forged"}, blocks[2]],
            "Invalid `signature` in `redacted_thinking` block",
        ),
    ],
    ids=["thinking-dropped", "redacted-dropped", "thinking-altered", "redacted-altered"],
)
async def test_a_follow_up_that_lost_or_altered_its_thinking_is_refused_like_the_real_api(
    client: anthropic.AsyncAnthropic, api: FakeMessagesAPI, spoil: Any, error: str
) -> None:
    served = await _first_turn(client)
    with pytest.raises(anthropic.BadRequestError, match=error):
        await client.messages.create(
            model=MODEL, max_tokens=4096, thinking=THINKING, tools=[TOOL], messages=_follow_up(spoil(served))
        )
    assert len(api.protocol_errors) == 1


async def test_thinking_from_an_earlier_turn_may_be_left_out(client: anthropic.AsyncAnthropic) -> None:
    """The API ignores thinking of turns before the last plain user message, so it does not check it."""
    served = await _first_turn(client)
    messages = [*_follow_up(served[2:])]
    messages[-1]["content"].append({"type": "text", "text": "Now answer."})
    answer = await client.messages.create(
        model=MODEL, max_tokens=4096, thinking=THINKING, tools=[TOOL], messages=messages
    )
    assert answer.content[0].type == "thinking"


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "greater than or equal to 1024"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "`max_tokens` must be greater"),
        ({"thinking": THINKING, "extra_body": {"temperature": 0.5}}, "`temperature` may only be set to 1"),
        ({"thinking": THINKING, "tool_choice": {"type": "any"}}, "tool_choice forces tool use"),
        ({"thinking": THINKING, "tool_choice": {"type": "tool", "name": "lookup"}}, "forces tool use"),
    ],
    ids=[
        "budget-too-small",
        "budget-not-below-max-tokens",
        "temperature",
        "tool-choice-any",
        "tool-choice-tool",
    ],
)
async def test_combinations_the_api_refuses_with_thinking_are_refused(
    client: anthropic.AsyncAnthropic, params: dict[str, Any], error: str
) -> None:
    with pytest.raises(anthropic.BadRequestError, match=error):
        await client.messages.create(model=MODEL, max_tokens=4096, tools=[TOOL], messages=[TASK], **params)


async def test_interleaved_thinking_lets_the_budget_reach_max_tokens(
    client: anthropic.AsyncAnthropic,
) -> None:
    message = await client.messages.create(
        model=MODEL,
        max_tokens=4096,
        thinking={"type": "enabled", "budget_tokens": 8192},
        tools=[TOOL],
        messages=[TASK],
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    assert message.stop_reason == "tool_use"


async def test_a_script_that_thinks_refuses_a_request_without_thinking(
    client: anthropic.AsyncAnthropic,
) -> None:
    with pytest.raises(anthropic.BadRequestError, match="does not turn thinking on"):
        await client.messages.create(model=MODEL, max_tokens=4096, tools=[TOOL], messages=[TASK])


def test_script_files_carry_thinking_blocks_both_ways() -> None:
    data = {
        "match": MARKER,
        "steps": [
            {
                "reply": {
                    "content": [
                        {"type": "thinking", "thinking": "Hm."},
                        {"type": "redacted_thinking", "data": "abc"},
                        {"type": "text", "text": "Done."},
                    ]
                }
            }
        ],
    }
    (script,) = parse_scripts(data)
    assert parse_scripts(scripts_to_data([script])) == [script]
    reply = script.steps[0]
    assert isinstance(reply, Reply)
    assert [b["type"] for b in reply.content] == ["thinking", "redacted_thinking", "text"]


@pytest.mark.parametrize(
    "block",
    [
        {"type": "thinking"},
        {"type": "thinking", "thinking": "x", "signature": 5},
        {"type": "redacted_thinking"},
    ],
)
def test_malformed_thinking_blocks_fail_at_construction(block: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="thinking"):
        Reply([block])
