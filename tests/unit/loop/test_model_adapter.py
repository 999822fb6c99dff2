"""The adapter against servers that speak the Messages API differently from the project's fake."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agentrun.loop.errors import RetryableModelError, RetryClass
from agentrun.loop.protocols import ModelRequest
from agentrun.model.anthropic_calling import AnthropicModel
from tests.support.messages_handler import Handler, client_of

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
async def _server(handler: Handler) -> AsyncIterator[AnthropicModel]:
    async with client_of(handler) as client:
        yield AnthropicModel(client)


REQUEST = ModelRequest(model="claude-haiku-4-5", max_tokens=100, messages=[{"role": "user", "content": "hi"}])


async def test_a_server_that_answers_a_stream_request_with_one_json_body_is_understood() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        assert (await request.json())["stream"] is True
        return web.json_response(MESSAGE, headers={"request-id": "req_9"})

    async with _server(handler) as model:
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

    async with _server(handler) as model:
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
