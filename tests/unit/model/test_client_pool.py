"""The SDK client pool: runs spread over a few clients, each run always on the same one."""

from __future__ import annotations

from typing import Literal

import anthropic
import pytest
from aiohttp import web

from agentrun.loop.protocols import ModelRequest
from agentrun.model.access import ModelAccess
from agentrun.model.anthropic_calling import ClientPool
from tests.support.messages_handler import serving

#: A whole non-streamed Message, as the Messages API answers.
PONG = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku-4-5",
    "content": [{"type": "text", "text": "pong"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


async def test_runs_are_spread_over_shards_and_a_run_keeps_its_client() -> None:
    pool = ClientPool(shards=4, max_connections=400)
    try:
        clients = {
            uid: pool.model(
                ModelAccess(api_key="sk-ant-pool", base_url="http://127.0.0.1:9"), shard_key=uid
            ).client
            for uid in (f"uid-{i}" for i in range(64))
        }
        assert len({id(c) for c in clients.values()}) == 4
        again = pool.model(
            ModelAccess(api_key="sk-ant-pool", base_url="http://127.0.0.1:9"), shard_key="uid-7"
        ).client
        assert again is clients["uid-7"]
        other_key = pool.model(
            ModelAccess(api_key="sk-ant-other", base_url="http://127.0.0.1:9"), shard_key="uid-7"
        )
        assert other_key.client is not clients["uid-7"]
    finally:
        await pool.close()


def _tls_context_of(client: anthropic.AsyncAnthropic) -> object:
    transport = client._client._transport  # type: ignore[attr-defined]
    if hasattr(transport, "ssl_context"):  # the SDK's aiohttp transport
        return transport.ssl_context
    return transport._pool._ssl_context


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_every_client_shares_one_tls_context_so_the_ca_bundle_is_loaded_once(
    transport: Literal["aiohttp", "httpx"],
) -> None:
    pool = ClientPool(shards=4, transport=transport)
    try:
        clients = {
            pool.model(ModelAccess(api_key=key, base_url="https://127.0.0.1:9"), shard_key=f"uid-{i}").client
            for key in ("sk-ant-a", "sk-ant-b")
            for i in range(32)
        }
        assert len(clients) == 8
        contexts = {id(_tls_context_of(c)) for c in clients}
        assert len(contexts) == 1
    finally:
        await pool.close()


async def test_runs_talk_to_the_messages_api_over_the_sdks_aiohttp_transport_by_default() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(PONG, headers={"request-id": "req_pool"})

    pool = ClientPool(shards=2)
    try:
        async with serving(handler) as url:
            model = pool.model(ModelAccess(api_key="sk-ant-pool", base_url=url), shard_key="uid-1")
            assert type(model.client._client._transport).__name__ == "AiohttpTransport"  # type: ignore[attr-defined]
            response = await model.complete(
                ModelRequest(
                    model="claude-haiku-4-5", max_tokens=16, messages=[{"role": "user", "content": "ping"}]
                )
            )
    finally:
        await pool.close()
    assert (response.content, response.request_id) == ([{"type": "text", "text": "pong"}], "req_pool")


async def test_pooled_clients_send_no_trace_context_of_the_sdks_own_spans() -> None:
    """The operator traces model requests itself; the SDK's spans (to the global provider, a no-op in the
    operator) would cost CPU on every request and put trace headers on requests to the Messages API."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("traceparent"))
        return web.json_response(PONG)

    request = ModelRequest(
        model="claude-haiku-4-5", max_tokens=16, messages=[{"role": "user", "content": "ping"}]
    )
    pool = ClientPool(shards=1)
    span = TracerProvider().get_tracer("test").start_span("reconcile")
    try:
        async with serving(handler) as url:
            with trace.use_span(span, end_on_exit=True):
                await pool.model(ModelAccess(api_key="sk-ant-pool", base_url=url)).complete(request)
                # The SDK's default, for contrast: it does propagate the active span's context.
                plain = anthropic.AsyncAnthropic(api_key="sk-ant-plain", base_url=url, max_retries=0)
                try:
                    await plain.messages.create(model="claude-haiku-4-5", max_tokens=16, messages=[])
                finally:
                    await plain.close()
    finally:
        await pool.close()
    pooled, default = seen
    assert pooled is None
    assert default is not None and format(span.get_span_context().trace_id, "032x") in default
