"""Delivering a planned answer over HTTP: JSON or SSE, and the faults that spoil a delivery on the wire.

The faults here are the ones only a real socket can show the SDK: a body cut halfway, a stream that ends
in an ``error`` event, a TCP reset before the headers or in the middle of the body. Everything is
decided beforehand by :mod:`~agentrun_sandbox.messages.planning`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from agentrun_sandbox.messages.dialects import ANTHROPIC, Dialect
from agentrun_sandbox.messages.planning import Plan, wire_reply
from agentrun_sandbox.messages.script import (
    ERROR_STATUS,
    ConnectionReset,
    HttpError,
    SlowResponse,
    StreamError,
    TruncatedStream,
)
from agentrun_sandbox.messages.wire import (
    Cut,
    Event,
    WireReply,
    error_body,
    stream_events,
    truncated_content,
)

#: Pause between the last bytes sent and a reset during the body, so the client has read them first.
RESET_GRACE_SECONDS = 0.05


def error_response(
    status: int, error_type: str, message: str, request_id: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """An API error in the body shape the SDK parses into its typed exceptions."""
    return web.json_response(
        error_body(error_type, message, request_id),
        status=status,
        headers={"request-id": request_id, **(headers or {})},
    )


async def serve(
    request: web.Request,
    request_id: str,
    body: dict[str, Any],
    plan: Plan,
    *,
    latency_seconds: float,
    bill: Callable[[Mapping[str, Any]], None] | None = None,
    dialect: Dialect = ANTHROPIC,
) -> web.StreamResponse:
    """Answers ``request`` as planned, after the latency a model response costs (errors come at once).

    ``bill`` gets the usage of every answer generated (also one cut short or sent to a client that is
    gone): an HTTP error costs nothing, a generated answer is billed whether it arrives or not.
    """
    fault = plan.fault
    if isinstance(fault, HttpError):
        return dialect.error(
            fault.status_code, fault.error_type, fault.error_message, request_id, fault.headers
        )
    if isinstance(fault, ConnectionReset) and fault.during == "headers":
        _reset(request)
        return web.Response(status=500)
    delay = latency_seconds + plan.reply.delay_seconds
    if isinstance(fault, SlowResponse):
        delay += fault.seconds
    if delay > 0:
        await asyncio.sleep(delay)
    headers = {**dialect.id_headers(request_id), **plan.reply.headers}
    truncation = fault if isinstance(fault, TruncatedStream) else None
    wire = wire_reply(body, plan, max_tokens_cut=truncation is not None and truncation.mode == "max_tokens")
    if bill is not None:
        bill(wire.usage())
    if body.get("stream") is True:
        return await _serve_stream(request, headers, wire, plan, request_id, dialect)
    if isinstance(fault, StreamError):
        status = ERROR_STATUS.get(fault.error_type, 500)
        return dialect.error(status, fault.error_type, fault.error_message, request_id)
    message = wire.message()
    if truncation is not None and truncation.mode == "max_tokens":
        message["content"] = truncated_content(wire.content, truncation.keep)
    payload = json.dumps(message, ensure_ascii=False).encode()
    if isinstance(fault, ConnectionReset) or (truncation is not None and truncation.mode == "cut"):
        return await _serve_partial_json(
            request, headers, payload, reset_connection=isinstance(fault, ConnectionReset)
        )
    return web.Response(body=payload, content_type="application/json", headers=headers)


async def _serve_stream(
    request: web.Request,
    headers: dict[str, str],
    wire: WireReply,
    plan: Plan,
    request_id: str,
    dialect: Dialect,
) -> web.StreamResponse:
    fault = plan.fault
    cut: Cut | None = None
    if isinstance(fault, TruncatedStream):
        cut = Cut(keep=fault.keep, finish=fault.mode == "max_tokens")
    events = stream_events(wire, cut)
    if isinstance(fault, StreamError | ConnectionReset):
        events = events[: _first_content_end(events)]
    if isinstance(fault, StreamError):
        events.append(("error", error_body(fault.error_type, fault.error_message, request_id)))
    response = web.StreamResponse(
        headers={
            **headers,
            "content-type": dialect.stream_content_type,
            "cache-control": "no-cache",
        }
    )
    await response.prepare(request)
    chunk_delay = plan.reply.chunk_delay_seconds
    if chunk_delay > 0:
        for event in events:
            await response.write(dialect.encode(event))
            await asyncio.sleep(chunk_delay)
    else:
        await response.write(b"".join(dialect.encode(event) for event in events))
    if isinstance(fault, ConnectionReset):
        await asyncio.sleep(RESET_GRACE_SECONDS)
        _reset(request)
        return response
    await response.write_eof()
    return response


async def _serve_partial_json(
    request: web.Request, headers: dict[str, str], payload: bytes, *, reset_connection: bool
) -> web.StreamResponse:
    """Announces the whole body, sends half of it, then drops the connection: with a reset (RST) for a
    connection fault, with a clean close (FIN) for a cut body."""
    response = web.StreamResponse(headers={**headers, "content-type": "application/json"})
    response.content_length = len(payload)
    await response.prepare(request)
    await response.write(payload[: len(payload) // 2])
    await asyncio.sleep(RESET_GRACE_SECONDS)
    if reset_connection:
        _reset(request)
    elif request.transport is not None:
        request.transport.close()
    return response


def _first_content_end(events: Sequence[Event]) -> int:
    """How many events carry the reply up to its first piece of content (at least message_start and ping)."""
    for index, (name, data) in enumerate(events):
        delta = data.get("delta") if name == "content_block_delta" else None
        if isinstance(delta, dict) and (delta.get("text") or delta.get("partial_json")):
            return index + 1
    return 2


def _reset(request: web.Request) -> None:
    """A real TCP reset (SO_LINGER 0), not a polite close: what a crashed proxy or load balancer does."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
