"""The fake Messages API's prompt cache, as the real SDK sees it in usage, and the breakpoint limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.caching import MIN_CACHEABLE_TOKENS
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block
from agentrun_sandbox.messages.wire import CHARS_PER_TOKEN

MODEL = "claude-sonnet-4-6"
MARK = {"type": "ephemeral"}
LONG = "x" * (CHARS_PER_TOKEN * 2 * MIN_CACHEABLE_TOKENS)  # a block of about 2048 tokens


@pytest.fixture
async def client() -> AsyncIterator[anthropic.AsyncAnthropic]:
    pinned = Script("[scenario:pinned]", [Reply([text_block("ok")], usage=ScriptUsage(input_tokens=7))])
    async with (
        FakeMessagesAPI([pinned], prompt_cache=True).running() as server,
        anthropic.AsyncAnthropic(api_key="sk", base_url=server.url, max_retries=0) as sdk,
    ):
        yield sdk


def _text(text: str, marked: bool = False) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"cache_control": MARK} if marked else {})}


async def _usage(client: anthropic.AsyncAnthropic, messages: list[dict[str, Any]], **params: Any) -> Any:
    params.setdefault("model", MODEL)
    params.setdefault("max_tokens", 100)
    message = await client.messages.create(messages=messages, **params)
    return message.usage


async def test_a_marked_prefix_is_written_once_then_read(client: anthropic.AsyncAnthropic) -> None:
    messages = [{"role": "user", "content": [_text(LONG, marked=True)]}]
    first = await _usage(client, messages)
    assert first.cache_read_input_tokens == 0
    assert first.cache_creation_input_tokens >= 2 * MIN_CACHEABLE_TOKENS
    again = await _usage(client, [*messages[:-1], {"role": "user", "content": [_text(LONG), _text("more")]}])
    assert again.cache_read_input_tokens == 0  # no mark, nothing read
    second = await _usage(client, messages)
    assert (second.cache_read_input_tokens, second.cache_creation_input_tokens) == (
        first.cache_creation_input_tokens,
        0,
    )


async def test_a_later_request_reads_the_earlier_prefix_and_writes_only_what_it_adds(
    client: anthropic.AsyncAnthropic,
) -> None:
    first = [{"role": "user", "content": [_text(LONG, marked=True)]}]
    written = (await _usage(client, first)).cache_creation_input_tokens
    longer = [
        {"role": "user", "content": [_text(LONG)]},
        {"role": "assistant", "content": [_text("noted")]},
        {"role": "user", "content": [_text("and then?", marked=True)]},
    ]
    usage = await _usage(client, longer)
    assert usage.cache_read_input_tokens == written
    assert 0 < usage.cache_creation_input_tokens < 50  # two short blocks
    assert usage.input_tokens == 0  # everything up to the last mark is read or written


async def test_an_earlier_entry_more_than_twenty_blocks_back_is_not_found(
    client: anthropic.AsyncAnthropic,
) -> None:
    await _usage(client, [{"role": "user", "content": [_text(LONG, marked=True)]}])
    many = [_text(LONG), *(_text(f"part {i}") for i in range(20)), _text("end", marked=True)]
    assert (await _usage(client, [{"role": "user", "content": many}])).cache_read_input_tokens == 0


async def test_short_prefixes_other_models_and_other_thinking_settings_miss(
    client: anthropic.AsyncAnthropic,
) -> None:
    short = [{"role": "user", "content": [_text("hello", marked=True)]}]
    await _usage(client, short)
    assert (await _usage(client, short)).cache_read_input_tokens == 0
    long = [{"role": "user", "content": [_text(LONG, marked=True)]}]
    await _usage(client, long)
    assert (await _usage(client, long, model="claude-haiku-4-5")).cache_read_input_tokens == 0
    thinking = {"type": "enabled", "budget_tokens": 1024}
    assert (await _usage(client, long, max_tokens=2048, thinking=thinking)).cache_read_input_tokens == 0


async def test_usage_a_script_pins_wins_over_the_cache(client: anthropic.AsyncAnthropic) -> None:
    messages = [{"role": "user", "content": [_text("[scenario:pinned] " + LONG, marked=True)]}]
    await _usage(client, messages)
    usage = await _usage(client, messages)
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (7, 0)


async def test_more_than_four_breakpoints_are_refused_like_the_real_api() -> None:
    async with (
        FakeMessagesAPI([]).running() as server,
        anthropic.AsyncAnthropic(api_key="sk", base_url=server.url, max_retries=0) as sdk,
    ):
        content = [_text(f"part {i}", marked=True) for i in range(5)]
        with pytest.raises(anthropic.BadRequestError, match="A maximum of 4 blocks with cache_control"):
            await _usage(sdk, [{"role": "user", "content": content}])
        assert (await _usage(sdk, [{"role": "user", "content": content[:4]}])).output_tokens > 0
