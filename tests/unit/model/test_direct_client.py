"""The direct client sends what the SDK sends and fails as the SDK path fails.

Both paths of the same ClientPool configuration ask the same server; the server records what arrived
(method, path, every header, the body's bytes) and both answers and errors are compared field by field.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import pytest
from aiohttp import web

from agentrun.loop.errors import FatalModelError, ModelCallError, RetryableModelError, RetryClass
from agentrun.loop.protocols import ModelRequest, ModelResponse, ServerContextEdits, Thinking, ToolDefinition
from agentrun.model.access import ModelAccess
from agentrun.model.anthropic_calling import AnthropicModel, ClientPool
from agentrun.model.direct_calling import request_body
from agentrun.model.params import build_params
from tests.support.local_servers import serving_app
from tests.support.messages_handler import Handler, serving
from tests.support.ports import free_port

Client = Literal["direct", "sdk"]
CLIENTS: tuple[Client, ...] = ("direct", "sdk")

#: Headers that may differ between the two paths because each request has its own: none with this SDK.
#: It sends no idempotency key to the Messages API (the client's idempotency header is unset), its
#: x-stainless-retry-count is 0 on every attempt (its retries are off; the loop retries), trace headers
#: are off (ClientPool), and Host and Content-Length are the same for the same server and body.
PER_REQUEST_HEADERS: frozenset[str] = frozenset()

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku-4-5",
    "content": [
        {"type": "text", "text": "fine"},
        {"type": "tool_use", "id": "tu_2", "name": "calc", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 2},
}

CALC = ToolDefinition(
    name="calc",
    description="adds numbers",
    input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
)
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 2+2? Réponds en français ✓"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "add", "signature": "sig"},
            {"type": "tool_use", "id": "tu_1", "name": "calc", "input": {"q": "2+2"}},
        ],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "4"}]},
]
REQUESTS = {
    "plain": ModelRequest(
        model="claude-haiku-4-5", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ),
    "with tools": ModelRequest(
        model="claude-haiku-4-5",
        max_tokens=1024,
        messages=HISTORY,
        system="You add numbers.",
        tools=[CALC],
        tool_choice={"type": "auto"},
    ),
    "with thinking": ModelRequest(
        model="claude-haiku-4-5",
        max_tokens=4096,
        messages=HISTORY,
        tools=[CALC],
        thinking=Thinking(budget_tokens=2048),
    ),
    "with context-management betas": ModelRequest(
        model="claude-haiku-4-5",
        max_tokens=2048,
        messages=HISTORY,
        tools=[CALC],
        server_context=ServerContextEdits(
            clear_keep=2, clear_trigger=4, compact=True, compact_trigger_tokens=50_000
        ),
    ),
    "with every other field": ModelRequest(
        model="claude-haiku-4-5",
        max_tokens=512,
        messages=HISTORY,
        system="Be brief.",
        temperature=0.25,
        stop_sequences=["END"],
        user_id="run-uid-1",
    ),
}


@contextlib.asynccontextmanager
async def _model(url: str, client: Client, **pool: Any) -> AsyncIterator[AnthropicModel]:
    clients = ClientPool(shards=1, client=client, **pool)
    try:
        yield clients.model(ModelAccess(api_key="sk-ant-direct", base_url=url), shard_key="uid")
    finally:
        await clients.close()


Arrival = tuple[str, str, list[tuple[str, str]], bytes]


@pytest.mark.parametrize("request_", REQUESTS.values(), ids=list(REQUESTS))
async def test_the_direct_client_sends_the_request_the_sdk_sends_byte_for_byte(
    request_: ModelRequest,
) -> None:
    arrived: list[Arrival] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        headers = sorted(
            (name.decode().lower(), value.decode())
            for name, value in request.raw_headers
            if name.decode().lower() not in PER_REQUEST_HEADERS
        )
        arrived.append((request.method, request.path_qs, headers, await request.read()))
        return web.json_response(MESSAGE, headers={"request-id": "req_same"})

    answers: list[ModelResponse] = []
    async with serving(handler) as url:
        for client in CLIENTS:
            async with _model(url, client) as model:
                answers.append(await model.complete(request_))
    direct, sdk = arrived
    assert direct[:2] == sdk[:2] == ("POST", "/v1/messages")
    assert dict(direct[2]) == dict(sdk[2]) and direct[2] == sdk[2]
    assert direct[3] == sdk[3]
    assert answers[0] == answers[1]
    assert answers[0].request_id == "req_same"


def test_a_body_with_a_nan_is_refused_before_it_is_sent_as_the_sdk_refuses_it() -> None:
    request = ModelRequest(model="claude-haiku-4-5", max_tokens=10, messages=HISTORY, temperature=math.nan)
    with pytest.raises(ValueError, match="Out of range float values"):
        request_body(build_params(request))


def _error(status: int, body: str | bytes, **headers: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        data = body if isinstance(body, bytes) else body.encode()
        content_type = "application/json" if data[:1] == b"{" else "text/plain"
        return web.Response(status=status, body=data, content_type=content_type, headers=headers)

    return handler


def _api_error(status: int, kind: object, message: object, **headers: str) -> Handler:
    return _error(
        status, json.dumps({"type": "error", "error": {"type": kind, "message": message}}), **headers
    )


ERRORS: dict[str, Handler] = {
    "529 overloaded with retry-after": _api_error(
        529, "overloaded_error", "Overloaded", **{"retry-after": "3"}
    ),
    "429 with retry-after-ms and request id": _api_error(
        429, "rate_limit_error", "slow down", **{"retry-after-ms": "1500", "request-id": "req_429"}
    ),
    "429 marked x-should-retry false": _api_error(
        429, "rate_limit_error", "no", **{"x-should-retry": "false"}
    ),
    "400 marked x-should-retry true": _api_error(
        400, "invalid_request_error", "odd", **{"x-should-retry": "true"}
    ),
    "500 api error": _api_error(500, "api_error", "Internal server error"),
    "503 with a body that is not JSON": _error(503, "upstream connect error"),
    "502 with no body": _error(502, b""),
    "408": _api_error(408, "timeout_error", "took too long"),
    "409": _api_error(409, "conflict", "try again"),
    "400 prompt too long": _api_error(
        400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000"
    ),
    "400 spend limit": _api_error(
        400, "invalid_request_error", "You have reached your specified API usage limits."
    ),
    "401": _api_error(401, "authentication_error", "invalid x-api-key", **{"request-id": "req_401"}),
    "403": _api_error(403, "permission_error", "nope"),
    "402 billing": _api_error(402, "billing_error", "pay"),
    "404": _api_error(404, "not_found_error", "model: claude-nope"),
    "413": _api_error(413, "request_too_large", "too big"),
    "422": _api_error(422, "invalid_request_error", "unprocessable"),
    "an error whose type and message are not strings": _api_error(400, 7, 8),
    "an error body without an error object": _error(400, '{"detail": "bad"}'),
    "a redirect that is not followed": _error(304, b""),
    "200 with a body cut short": _error(200, json.dumps(MESSAGE)[:40]),
    "200 with a body that is not a message": _error(200, '{"type": "completion"}'),
}


def _seen(exc: ModelCallError) -> dict[str, object]:
    return {"type": type(exc).__name__, **vars(exc)}


async def _failure(model: AnthropicModel) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        await model.complete(REQUESTS["plain"])
    return caught.value


@pytest.mark.parametrize("handler", ERRORS.values(), ids=list(ERRORS))
async def test_an_error_answer_is_the_same_loop_error_over_both_clients(handler: Handler) -> None:
    async with serving(handler) as url:
        failures = []
        for client in CLIENTS:
            async with _model(url, client) as model:
                failures.append(_seen(await _failure(model)))
    direct, sdk = failures
    assert direct == sdk


async def test_the_translated_errors_are_the_documented_ones() -> None:
    """A sample of the mapping itself (the fault matrix has the rest), so equality above is not two
    equal mistakes."""
    expected = {
        "529 overloaded with retry-after": (RetryClass.OVERLOADED, 3.0),
        "429 with retry-after-ms and request id": (RetryClass.RATE_LIMITED, 1.5),
        "503 with a body that is not JSON": (RetryClass.SERVER_ERROR, None),
        "200 with a body cut short": (RetryClass.CONNECTION, None),
    }
    for name, (retry_class, after) in expected.items():
        async with serving(ERRORS[name]) as url, _model(url, "direct") as model:
            failure = await _failure(model)
        assert isinstance(failure, RetryableModelError), name
        assert (failure.retry_class, failure.retry_after) == (retry_class, after), name
    async with serving(ERRORS["401"]) as url, _model(url, "direct") as model:
        failure = await _failure(model)
    assert isinstance(failure, FatalModelError)
    assert (failure.reason, failure.status, failure.request_id) == ("AuthenticationFailed", 401, "req_401")


async def _cut_body(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "application/json", "content-length": "500"})
    await response.prepare(request)
    await response.write(json.dumps(MESSAGE).encode()[:30])
    assert request.transport is not None
    request.transport.close()
    return response


async def _slow(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(5)
    return web.json_response(MESSAGE)


async def _reset(request: web.Request) -> web.StreamResponse:
    assert request.transport is not None
    request.transport.abort()
    return web.Response()


TRANSPORT: dict[str, tuple[Callable[[web.Request], Awaitable[web.StreamResponse]], RetryClass]] = {
    "connection closed inside the body": (_cut_body, RetryClass.CONNECTION),
    "connection reset before the headers": (_reset, RetryClass.CONNECTION),
    "no answer within the read timeout": (_slow, RetryClass.TIMEOUT),
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("case", TRANSPORT.values(), ids=list(TRANSPORT))
async def test_a_transport_failure_is_retried_in_the_same_class_over_both_clients(
    case: tuple[Handler, RetryClass], client: Client
) -> None:
    handler, retry_class = case
    async with serving(handler) as url, _model(url, client, timeout_seconds=0.5) as model:
        failure = await _failure(model)
    assert isinstance(failure, RetryableModelError)
    assert (failure.retry_class, failure.status, failure.request_id) == (retry_class, None, None)


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_server_that_is_not_there_is_a_connection_error_over_both_clients(client: Client) -> None:
    async with _model(f"http://127.0.0.1:{free_port()}", client) as model:
        failure = await _failure(model)
    assert isinstance(failure, RetryableModelError) and failure.retry_class is RetryClass.CONNECTION


@pytest.mark.parametrize("client", CLIENTS)
async def test_requests_go_through_the_proxy_the_environment_names_over_both_clients(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY as the SDK's client reads it; the proxy here answers itself, as the endpoint."""
    through: list[str] = []

    async def proxy(request: web.Request) -> web.StreamResponse:
        through.append(f"{request.method} {request.url}")
        return web.json_response(MESSAGE)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy)
    async with serving_app(app) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with _model("http://messages.invalid:8080", client) as model:
            response = await model.complete(REQUESTS["plain"])
    assert through == ["POST http://messages.invalid:8080/v1/messages"]
    assert response.content[0] == {"type": "text", "text": "fine"}


async def test_the_pool_sends_through_the_direct_client_unless_told_to_use_the_sdk() -> None:
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("user-agent"))
        return web.json_response(MESSAGE)

    async with serving(handler) as url:
        for client in CLIENTS:
            async with _model(url, client) as model:
                assert (model._direct is not None) is (client == "direct")
                await model.complete(REQUESTS["plain"])
    assert len(seen) == 2 and seen[0] == seen[1]
