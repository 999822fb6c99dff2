"""A streamed answer, folded from the raw events, equals what the SDK's own stream helper builds.

Every case is answered twice by the same server: once through ``AnthropicModel.complete`` and once
through ``messages.stream(...).get_final_message()``, the helper the adapter relied on before, dumped
the way the adapter dumped it. Cases the project's fake Messages API can script run against it; blocks
it cannot script (thinking, citations, server tools) come from a small server replaying fixed events.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anthropic
import pytest
from aiohttp import web

from agentrun.api.usage import TokenUsage
from agentrun.loop.errors import FatalModelError, RetryableModelError, RetryClass
from agentrun.loop.protocols import ModelRequest, ModelResponse
from agentrun.model.anthropic_calling import AnthropicModel, build_params
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    Reply,
    Script,
    ScriptUsage,
    TruncatedStream,
    text_block,
    tool_use_block,
)
from tests.support.messages_handler import client_of

MODEL = "claude-sonnet-4-6"
KEY = "sk-ant-test-key"
SEARCH_INPUT = {
    "query": "pods that restarted more than three times in the last hour " * 3,
    "filters": {"namespace": "default", "labels": ["app=web", "tier=frontend"], "limit": 25},
    "since": None,
    "note": "naïve café ☃ 日本語",
}
PATCH_INPUT = {
    "path": "/etc/app/config.yaml",
    "replace": [{"line": n, "text": f"key{n}: v"} for n in range(8)],
}
Event = dict[str, Any]


def request(marker: str) -> ModelRequest:
    return ModelRequest(
        model=MODEL,
        max_tokens=1024,
        messages=[{"role": "user", "content": f"{marker} go"}],
        system="Be brief.",
    )


async def both(
    client: anthropic.AsyncAnthropic, req: ModelRequest
) -> tuple[ModelResponse, anthropic.types.Message]:
    ours = await AnthropicModel(client, always_stream=True).complete(req)
    async with client.messages.stream(**build_params(req)) as stream:
        helpers = await stream.get_final_message()
    return ours, helpers


def dumped(message: anthropic.types.Message) -> list[dict[str, Any]]:
    return [block.model_dump(mode="json", exclude_none=True) for block in message.content]


def usage_of(message: anthropic.types.Message) -> TokenUsage:
    usage = message.usage
    return TokenUsage(
        usage.input_tokens or 0,
        usage.output_tokens or 0,
        usage.cache_creation_input_tokens or 0,
        usage.cache_read_input_tokens or 0,
    )


@contextlib.asynccontextmanager
async def fake_api(
    *steps: Reply, marker: str
) -> AsyncIterator[tuple[FakeMessagesAPI, anthropic.AsyncAnthropic]]:
    async with (
        FakeMessagesAPI([Script(marker, list(steps))], demo_brain=False).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        yield api, client


async def test_text_and_several_tool_calls_split_into_many_json_chunks_are_rebuilt_exactly() -> None:
    reply = Reply(
        [
            text_block("Let me search first, then patch the config. " * 4),
            tool_use_block("search", SEARCH_INPUT),
            tool_use_block("patch", PATCH_INPUT),
            tool_use_block("noop", {}),
        ],
        usage=ScriptUsage(
            input_tokens=120, output_tokens=40, cache_creation_input_tokens=7, cache_read_input_tokens=900
        ),
    )
    async with fake_api(reply, marker="[multi]") as (api, client):
        ours, helpers = await both(client, request("[multi]"))

    assert ours.content == dumped(helpers)
    assert [block["type"] for block in ours.content] == ["text", "tool_use", "tool_use", "tool_use"]
    assert ours.content[0]["text"] == "Let me search first, then patch the config. " * 4
    assert [block["input"] for block in ours.content[1:]] == [SEARCH_INPUT, PATCH_INPUT, {}]
    assert all(block["id"].startswith("toolu_") for block in ours.content[1:])
    assert ours.stop_reason == helpers.stop_reason == "tool_use"
    assert ours.usage == usage_of(helpers) == TokenUsage(120, 40, 7, 900)
    assert ours.model == helpers.model == MODEL
    assert ours.request_id == api.requests[0].request_id


async def test_a_tool_call_cut_by_max_tokens_keeps_the_properties_complete_before_the_cut() -> None:
    reply = Reply(
        [text_block("Patching."), tool_use_block("patch", PATCH_INPUT)],
        faults=[TruncatedStream(mode="max_tokens", keep=0.6, times=2)],
    )
    async with fake_api(reply, marker="[cut]") as (_, client):
        ours, helpers = await both(client, request("[cut]"))

    assert ours.content == dumped(helpers)
    assert ours.stop_reason == "max_tokens"
    cut = ours.content[-1]["input"]
    assert cut["path"] == PATCH_INPUT["path"]
    assert cut != PATCH_INPUT


@pytest.mark.parametrize(
    ("reply", "stop_reason", "stop_sequence", "stop_details"),
    [
        (
            Reply(
                [],
                stop_reason="refusal",
                stop_details={"type": "refusal", "category": "cyber", "explanation": "No."},
            ),
            "refusal",
            None,
            {"type": "refusal", "category": "cyber", "explanation": "No."},
        ),
        (Reply([text_block("one two")], stop_sequence="###"), "stop_sequence", "###", None),
        (
            Reply([text_block("hm")], unknown_stop_reason="model_wandered_off"),
            "model_wandered_off",
            None,
            None,
        ),
    ],
    ids=["refusal with stop_details", "stop sequence", "unknown stop reason"],
)
async def test_how_the_answer_stopped_is_kept(
    reply: Reply, stop_reason: str, stop_sequence: str | None, stop_details: dict[str, Any] | None
) -> None:
    async with fake_api(reply, marker="[stop]") as (_, client):
        ours, helpers = await both(client, request("[stop]"))

    assert ours.content == dumped(helpers)
    assert (ours.stop_reason, ours.stop_sequence) == (stop_reason, stop_sequence)
    assert (helpers.stop_reason, helpers.stop_sequence) == (stop_reason, stop_sequence)
    assert ours.stop_details == stop_details


# ---------------------------------------------------------------------------------------------- replayed


def sse(events: Sequence[Event | tuple[str, str]]) -> bytes:
    """Named like the API names them; a (name, data) pair sends data verbatim."""
    frames = []
    for event in events:
        name, data = event if isinstance(event, tuple) else (event["type"], json.dumps(event))
        frames.append(f"event: {name}\ndata: {data}\n\n")
    return "".join(frames).encode()


@contextlib.asynccontextmanager
async def replaying(events: Sequence[Event | tuple[str, str]]) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async def handler(request: web.Request) -> web.StreamResponse:
        assert (await request.json())["stream"] is True
        response = web.StreamResponse(
            headers={"content-type": "text/event-stream", "request-id": "req_replay"}
        )
        await response.prepare(request)
        for event in events:  # one write per event, so the client sees them arrive apart
            await response.write(sse([event]))
        await response.write_eof()
        return response

    async with client_of(handler, api_key=KEY) as client:
        yield client


def start(usage: dict[str, Any] | None = None) -> Event:
    message = {
        "id": "msg_replay",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 10, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def block(index: int, content_block: dict[str, Any], *deltas: dict[str, Any]) -> list[Event]:
    return [
        {"type": "content_block_start", "index": index, "content_block": content_block},
        *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def json_deltas(value: object, size: int) -> list[dict[str, Any]]:
    text = json.dumps(value)
    return [
        {"type": "input_json_delta", "partial_json": piece}
        for piece in ["", *(text[i : i + size] for i in range(0, len(text), size))]
    ]


def end(stop_reason: str = "end_turn", usage: dict[str, Any] | None = None) -> list[Event]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": usage or {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]


CITATIONS = [
    {
        "type": "char_location",
        "cited_text": "The sky is blue.",
        "document_index": 0,
        "document_title": None,
        "start_char_index": 0,
        "end_char_index": 16,
        "file_id": None,
    },
    {
        "type": "page_location",
        "cited_text": "Rayleigh scattering.",
        "document_index": 1,
        "document_title": "Optics",
        "start_page_number": 3,
        "end_page_number": 4,
        "file_id": None,
    },
]
LOOKUP_INPUT = {"q": "sky", "since": None, "tags": ["a", "b"], "deep": {"x": None, "y": [1, 2.5, True]}}
RICH = [
    start(
        {
            "input_tokens": 10,
            "output_tokens": 1,
            "cache_creation_input_tokens": 3,
            "cache_read_input_tokens": 5,
        }
    ),
    {"type": "ping"},
    *block(
        0,
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "thinking_delta", "thinking": "The user asks "},
        {"type": "thinking_delta", "thinking": "about the sky."},
        {"type": "signature_delta", "signature": "EqQBCkYIBxgCKkB"},
    ),
    *block(1, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}),
    *block(
        2,
        {"type": "text", "text": "", "citations": None},
        {"type": "text_delta", "text": "The sky "},
        {"type": "citations_delta", "citation": CITATIONS[0]},
        {"type": "text_delta", "text": "is blue."},
        {"type": "citations_delta", "citation": CITATIONS[1]},
    ),
    *block(
        3,
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        *json_deltas({"query": "why is the sky blue"}, 5),
    ),
    *block(
        4,
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_1",
            "content": [
                {
                    "type": "web_search_result",
                    "url": "https://example.com/sky",
                    "title": "Sky",
                    "encrypted_content": "EqgfCioIARgBIiQ3",
                    "page_age": None,
                }
            ],
        },
    ),
    {"type": "ping"},
    *block(
        5, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}, *json_deltas(LOOKUP_INPUT, 3)
    ),
    *block(6, {"type": "tool_use", "id": "toolu_2", "name": "noop", "input": {}}),
    *end("tool_use", {"output_tokens": 99, "input_tokens": 12, "cache_read_input_tokens": None}),
]


async def test_thinking_citations_and_server_tool_blocks_are_rebuilt_like_the_sdk_helper() -> None:
    async with replaying(RICH) as client:
        ours, helpers = await both(client, request("[rich]"))

    assert ours.content == dumped(helpers)
    thinking, redacted, text, server_tool, result, lookup, noop = ours.content
    assert thinking == {
        "type": "thinking",
        "thinking": "The user asks about the sky.",
        "signature": "EqQBCkYIBxgCKkB",
    }
    assert redacted == {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    assert text["text"] == "The sky is blue."
    assert text["citations"] == [{k: v for k, v in c.items() if v is not None} for c in CITATIONS]
    assert server_tool["input"] == {"query": "why is the sky blue"}
    assert "page_age" not in result["content"][0]
    assert lookup["input"] == LOOKUP_INPUT  # nulls inside tool input are the model's data: kept
    assert noop["input"] == {}
    assert ours.request_id == "req_replay"


async def test_usage_in_message_delta_overrides_message_start_except_where_null_or_missing() -> None:
    async with replaying(RICH) as client:
        ours, helpers = await both(client, request("[usage]"))

    # input 10 → 12 and output 1 → 99 from message_delta; cache read null and cache creation left out there.
    assert ours.usage == usage_of(helpers) == TokenUsage(12, 99, 3, 5)


async def test_events_and_deltas_this_client_does_not_know_are_ignored() -> None:
    events = [
        start(),
        {"type": "future_event", "payload": {"x": 1}},
        *block(
            0,
            {"type": "text", "text": "Hi", "citations": None},
            {"type": "future_delta", "whatever": True},
            {"type": "text_delta", "text": " there"},
        ),
        *block(
            1,
            {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}},
            {"type": "text_delta", "text": "x"},
        ),
        *end(),
    ]
    async with replaying(events) as client:
        response, helpers = await both(client, request("[unknown]"))

    assert response.content == dumped(helpers)
    assert response.content == [
        {"type": "text", "text": "Hi there"},
        {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}},
    ]
    assert response.stop_reason == "end_turn"


@pytest.mark.parametrize(
    "events",
    [
        [start(), *block(0, {"type": "text", "text": ""}, {"type": "text_delta", "text": "half an ans"})],
        [start(), {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}],
        [start(), *block(0, {"type": "text", "text": "done"}), end()[0]],
        [*block(0, {"type": "text", "text": "no start"}), *end()],
    ],
    ids=["cut inside a block", "cut after a block start", "no message_stop", "no message_start"],
)
async def test_a_stream_cut_short_is_retried_and_names_its_request(events: list[Event]) -> None:
    async with replaying(events) as client:
        with pytest.raises(RetryableModelError) as caught:
            await AnthropicModel(client, always_stream=True).complete(request("[short]"))

    assert caught.value.retry_class is RetryClass.CONNECTION
    assert "the answer was cut off" in caught.value.message
    assert caught.value.request_id == "req_replay"


async def test_an_error_event_inside_the_stream_is_retried_with_the_request_id() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    events = [start(), *block(0, {"type": "text", "text": "Hi"}), error]
    async with replaying(events) as client:
        with pytest.raises(RetryableModelError) as caught:
            await AnthropicModel(client, always_stream=True).complete(request("[error]"))

    assert caught.value.retry_class is RetryClass.OVERLOADED
    assert "Overloaded" in caught.value.message
    assert caught.value.request_id == "req_replay"


@pytest.mark.parametrize(
    "events",
    [
        [
            start(),
            {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}},
            *end(),
        ],
        [start(), *block(0, {"type": "text", "text": ""}, {"type": "text_delta"}), *end()],
        [
            start(),
            *block(
                0,
                {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}},
                {"type": "input_json_delta", "partial_json": "{nope}"},
            ),
            *end(),
        ],
        [start(), ("content_block_start", "{not json"), *end()],
    ],
    ids=[
        "delta for a block never started",
        "delta without its text",
        "tool input that is not JSON",
        "data that is not JSON",
    ],
)
async def test_a_malformed_stream_ends_the_run_as_a_model_error(
    events: list[Event | tuple[str, str]],
) -> None:
    async with replaying(events) as client:
        with pytest.raises(FatalModelError) as caught:
            await AnthropicModel(client, always_stream=True).complete(request("[malformed]"))

    assert caught.value.reason == "ModelError"
    assert caught.value.message.startswith("unexpected response from the Messages API")
    assert caught.value.request_id == "req_replay"
