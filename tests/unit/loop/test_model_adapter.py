"""The adapter against servers that speak the Messages API differently from the project's fake."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import anthropic
import pytest
from aiohttp import web
from anthropic._constants import MODEL_NONSTREAMING_TOKENS

from agentrun.loop.errors import RetryableModelError, RetryClass
from agentrun.loop.protocols import ModelRequest
from agentrun.model.anthropic_calling import AnthropicModel, needs_streaming
from tests.support.messages_handler import Handler, client_of, serving

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku-4-5",
    "content": [
        {"type": "text", "text": "hello"},
        {"type": "tool_use", "id": "tu_1", "name": "t", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 3},
}


@contextlib.asynccontextmanager
async def _server(handler: Handler, *, always_stream: bool = False) -> AsyncIterator[AnthropicModel]:
    async with client_of(handler) as client:
        yield AnthropicModel(client, always_stream=always_stream)


REQUEST = ModelRequest(model="claude-haiku-4-5", max_tokens=100, messages=[{"role": "user", "content": "hi"}])


async def test_a_server_that_answers_a_stream_request_with_one_json_body_is_understood() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        assert (await request.json())["stream"] is True
        return web.json_response(MESSAGE, headers={"request-id": "req_9"})

    async with _server(handler, always_stream=True) as model:
        response = await model.complete(REQUEST)
    assert response.stop_reason == "tool_use"
    assert response.content == MESSAGE["content"]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 7)
    assert response.usage.cache_read_input_tokens == 3
    assert response.request_id == "req_9"


async def test_a_stream_with_no_events_is_retried_as_a_connection_error() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write_eof()
        return response

    async with _server(handler, always_stream=True) as model:
        with pytest.raises(RetryableModelError) as caught:
            await model.complete(REQUEST)
    assert caught.value.retry_class is RetryClass.CONNECTION
    assert "message_start" in caught.value.message


async def test_a_json_body_cut_short_is_retried_as_a_connection_error() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=json.dumps(MESSAGE)[:40], content_type="application/json")

    async with _server(handler) as model:
        with pytest.raises(RetryableModelError) as caught:
            await model.complete(REQUEST)
    assert caught.value.retry_class is RetryClass.CONNECTION


async def test_a_request_the_sdk_sends_without_streaming_goes_as_one_json_request() -> None:
    bodies: list[dict[str, object]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        return web.json_response(MESSAGE, headers={"request-id": "req_7"})

    async with _server(handler) as model:
        response = await model.complete(REQUEST)
    assert bodies[0].get("stream") in (None, False)
    assert response.content == MESSAGE["content"]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 7)
    assert response.request_id == "req_7"


@pytest.mark.parametrize(
    ("model_name", "max_tokens"),
    [("claude-sonnet-4-6", 64_000), ("claude-opus-4-1@20250805", 10_000)],
    ids=["an answer that may take longer than ten minutes", "above the model's non-streaming limit"],
)
async def test_a_request_the_sdk_refuses_without_streaming_is_streamed(
    model_name: str, max_tokens: int
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        assert (await request.json())["stream"] is True
        return web.json_response(MESSAGE)

    request = ModelRequest(
        model=model_name, max_tokens=max_tokens, messages=[{"role": "user", "content": "hi"}]
    )
    async with _server(handler) as model:
        assert (await model.complete(request)).stop_reason == "tool_use"


@pytest.mark.parametrize("model_name", ["claude-sonnet-4-6", "claude-opus-4-1@20250805", "claude-haiku-4-5"])
@pytest.mark.parametrize("max_tokens", [1, 4096, 8192, 8193, 21_333, 21_334, 64_000])
def test_requests_are_streamed_exactly_where_the_sdk_refuses_them_without_streaming(
    model_name: str, max_tokens: int
) -> None:
    client = anthropic.AsyncAnthropic(api_key="sk-ant-rule", base_url="http://127.0.0.1:9")
    try:
        client._calculate_nonstreaming_timeout(max_tokens, MODEL_NONSTREAMING_TOKENS.get(model_name))
    except ValueError:
        refused = True
    else:
        refused = False
    assert needs_streaming(model_name, max_tokens) is refused


async def test_a_non_streaming_answer_drops_null_fields_as_a_streamed_one_does() -> None:
    body = {
        **MESSAGE,
        "content": [
            {"type": "text", "text": "hello", "citations": None},
            {"type": "tool_use", "id": "tu_1", "name": "t", "input": {"keep": None}},
        ],
    }

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    async with _server(handler) as model:
        response = await model.complete(REQUEST)
    assert response.content == [
        {"type": "text", "text": "hello"},
        {"type": "tool_use", "id": "tu_1", "name": "t", "input": {"keep": None}},
    ]


async def test_a_request_whose_answer_may_outlast_the_clients_read_timeout_is_streamed() -> None:
    streamed: list[bool] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        streamed.append((await request.json()).get("stream") is True)
        return web.json_response(MESSAGE)

    async with serving(handler) as url:
        # 4096 tokens may take about two minutes; this client waits 30 s for a read.
        client = anthropic.AsyncAnthropic(api_key="k", base_url=url, max_retries=0, timeout=30)
        try:
            model = AnthropicModel(client)
            await model.complete(
                ModelRequest(model="claude-haiku-4-5", max_tokens=4096, messages=REQUEST.messages)
            )
            await model.complete(REQUEST)  # 100 tokens: within 30 s
        finally:
            await client.close()
    assert streamed == [True, False]
