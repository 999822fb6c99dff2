"""A scripted fake of the Anthropic Messages API, served over real HTTP for the real ``anthropic`` SDK.

Tests, benchmarks and the offline demo point ``AsyncAnthropic(base_url=api.url)`` at it, so the operator's
model adapter, the SDK's parsing, streaming and retry code all run for real; only the model is scripted.

In-process::

    async with FakeMessagesAPI(scripts=[...]).running(host="127.0.0.1", port=0) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)

As a child process (prints one line ``READY http://127.0.0.1:PORT``, serves until SIGTERM or SIGINT)::

    python -m agentrun_sandbox.messages.server --port 0 [--script FILE]... [--latency SECONDS]
        [--require-api-key KEY] [--no-demo-brain] [--access-log]

Routes: ``POST /v1/messages`` (JSON or ``"stream": true`` SSE), ``POST /v1/messages/count_tokens``,
``GET /healthz``; anything else is a 404 ``not_found_error``. Every response carries a ``request-id``.

What a request gets, in order: 401 ``authentication_error`` if ``require_api_key`` is set and neither
``x-api-key`` nor ``Authorization: Bearer`` carries it; 400 ``invalid_request_error`` for a body the real API
would reject (see :mod:`~agentrun_sandbox.messages.protocol`; also recorded in :attr:`protocol_errors`);
then the first script whose ``match``/``model`` fits, at the step given by the number of assistant messages
in the request (400 if the script has no such step); else the demo brain
(:mod:`~agentrun_sandbox.messages.brain`), or 400 when it is switched off.

``latency_seconds`` delays every model response (replies, brain answers, and the faults that imitate a
model response: stream errors, truncations, resets during the body, slow responses) before its headers,
with a plain ``asyncio.sleep``, so a thousand concurrent slow requests cost next to nothing. HTTP error
faults, resets before the headers, 401 and 400 answers are immediate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import socket
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from agentrun_sandbox.messages.brain import demo_reply
from agentrun_sandbox.messages.protocol import (
    ProtocolError,
    assistant_turns,
    first_user_text,
    validate_request,
)
from agentrun_sandbox.messages.script import (
    ERROR_STATUS,
    ConnectionReset,
    Fault,
    HttpError,
    Reply,
    Script,
    SlowResponse,
    StreamError,
    TruncatedStream,
)
from agentrun_sandbox.messages.wire import (
    Cut,
    Event,
    WireReply,
    derived_id,
    error_body,
    estimate_input_tokens,
    estimate_tokens,
    new_request_id,
    sse,
    stream_events,
    truncated_content,
)

__all__ = ["FakeMessagesAPI", "RecordedRequest"]

#: Header names whose values :meth:`RecordedRequest.redacted` hides.
SECRET_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization", "cookie", "set-cookie"})
REDACTED = "<redacted>"
#: Pause between the last bytes sent and a reset during the body, so the client has read them first.
RESET_GRACE_SECONDS = 0.05


@dataclass(frozen=True)
class RecordedRequest:
    """One request as it arrived, with what the server decided to do about it."""

    arrived_at: float
    """Wall-clock arrival time (``time.time()``)."""
    method: str
    path: str
    headers: Mapping[str, str]
    """Lower-cased names; secrets are kept so tests can check auth (see :meth:`redacted`)."""
    body: Any
    """The parsed JSON body, or ``None`` when it was not JSON."""
    request_id: str
    script: str | None
    """Key of the script that answered, ``None`` for the demo brain and for rejected requests."""
    step: int | None
    """Step index (assistant messages in the request) for answered requests."""
    outcome: str
    """``reply``, ``demo_brain``, a fault kind (e.g. ``http_error``), ``invalid_request``, ``unauthorized``,
    ``count_tokens`` or ``not_found``."""

    @property
    def model(self) -> str | None:
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def first_user_text(self) -> str:
        return first_user_text(self.body) if isinstance(self.body, dict) else ""

    def redacted(self) -> RecordedRequest:
        """A copy safe to print or attach to a failure report."""
        headers = {
            name: REDACTED if name in SECRET_HEADERS else value for name, value in self.headers.items()
        }
        return replace(self, headers=headers)


@dataclass(frozen=True)
class _Plan:
    script: str | None
    step: int
    conversation: str
    reply: Reply
    fault: Fault | None


class FakeMessagesAPI:
    """The fake server: scripts, fault counters and the request log; see the module docstring."""

    def __init__(
        self,
        scripts: Iterable[Script] = (),
        *,
        require_api_key: str | None = None,
        latency_seconds: float = 0.0,
        demo_brain: bool = True,
        max_recorded_requests: int | None = None,
        access_log: bool = False,
    ) -> None:
        self._scripts: list[Script] = list(scripts)
        self.require_api_key = require_api_key
        self.latency_seconds = latency_seconds
        self.demo_brain = demo_brain
        self._access_log = access_log
        self._requests: deque[RecordedRequest] = deque(maxlen=max_recorded_requests)
        self._fault_counts: dict[tuple[str, str, int], int] = {}
        self.protocol_errors: list[str] = []
        """Every 400 this server answered with, so a test can assert the client kept to the protocol."""
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    # ------------------------------------------------------------------------------------------ scripts

    @property
    def scripts(self) -> tuple[Script, ...]:
        return tuple(self._scripts)

    def add_script(self, script: Script) -> None:
        """Scripts are tried in the order added; the first that matches answers."""
        self._scripts.append(script)

    # ------------------------------------------------------------------------------------------ requests

    @property
    def requests(self) -> list[RecordedRequest]:
        return list(self._requests)

    def requests_for(self, match: str) -> list[RecordedRequest]:
        """Requests of one conversation family: the first user message contains ``match``, or the model or the
        answering script's key equals it."""
        return [r for r in self._requests if match in r.first_user_text or match in (r.model, r.script)]

    def redacted_requests(self) -> list[RecordedRequest]:
        return [r.redacted() for r in self._requests]

    def clear(self, *, faults: bool = True) -> None:
        """Forgets recorded requests and protocol errors, and by default the fault counters too, so the next
        request sees every scripted fault again."""
        self._requests.clear()
        self.protocol_errors.clear()
        if faults:
            self._fault_counts.clear()

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """The base URL to give ``AsyncAnthropic(base_url=...)``."""
        if self._url is None:
            raise RuntimeError("the fake Messages API is not running")
        return self._url

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._handle_messages)
        app.router.add_post("/v1/messages/count_tokens", self._handle_count_tokens)
        app.router.add_get("/healthz", self._handle_health)
        app.router.add_route("*", "/{tail:.*}", self._handle_not_found)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        if self._runner is not None:
            raise RuntimeError("the fake Messages API is already running")
        # handler_cancellation stops a slow-response handler as soon as its client gives up; the short
        # shutdown_timeout keeps stop() from waiting on such handlers.
        runner = web.AppRunner(
            self.make_app(),
            handler_cancellation=True,
            shutdown_timeout=1.0,
            access_log=logging.getLogger("aiohttp.access") if self._access_log else None,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, backlog=4096)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        bound_port = runner.addresses[0][1]
        self._runner = runner
        self._url = f"http://[{host}]:{bound_port}" if ":" in host else f"http://{host}:{bound_port}"
        return self._url

    async def stop(self) -> None:
        runner, self._runner, self._url = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    @contextlib.asynccontextmanager
    async def running(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[FakeMessagesAPI]:
        await self.start(host, port)
        try:
            yield self
        finally:
            await self.stop()

    # ------------------------------------------------------------------------------------------ handlers

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok", headers={"request-id": new_request_id()})

    async def _handle_not_found(self, request: web.Request) -> web.Response:
        request_id = new_request_id()
        body = await self._read_json(request)
        self._record(request, request_id, body, "not_found")
        return _error(404, "not_found_error", f"{request.method} {request.path} does not exist", request_id)

    async def _handle_count_tokens(self, request: web.Request) -> web.Response:
        request_id = new_request_id()
        body = await self._read_json(request)
        rejection = self._reject(request, request_id, body, count_tokens=True)
        if rejection is not None:
            return rejection
        self._record(request, request_id, body, "count_tokens")
        return web.json_response(
            {"input_tokens": estimate_input_tokens(body)}, headers={"request-id": request_id}
        )

    async def _handle_messages(self, request: web.Request) -> web.StreamResponse:
        request_id = new_request_id()
        body = await self._read_json(request)
        rejection = self._reject(request, request_id, body, count_tokens=False)
        if rejection is not None:
            return rejection
        try:
            plan = self._plan(body)
        except ProtocolError as err:
            self.protocol_errors.append(str(err))
            self._record(request, request_id, body, "invalid_request")
            return _error(400, "invalid_request_error", str(err), request_id)
        outcome = plan.fault.kind if plan.fault else "reply" if plan.script else "demo_brain"
        self._record(request, request_id, body, outcome, script=plan.script, step=plan.step)
        return await self._serve(request, request_id, body, plan)

    async def _read_json(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _reject(
        self, request: web.Request, request_id: str, body: Any, *, count_tokens: bool
    ) -> web.Response | None:
        """The checks the real API makes before it looks at the conversation: auth, version, body shape."""
        if not self._authorised(request):
            self._record(request, request_id, body, "unauthorized")
            return _error(401, "authentication_error", "invalid x-api-key", request_id)
        try:
            if "anthropic-version" not in request.headers:
                raise ProtocolError("anthropic-version: header is required")
            validate_request(body, count_tokens=count_tokens)
        except ProtocolError as err:
            self.protocol_errors.append(str(err))
            self._record(request, request_id, body, "invalid_request")
            return _error(400, "invalid_request_error", str(err), request_id)
        return None

    def _authorised(self, request: web.Request) -> bool:
        if self.require_api_key is None:
            return True
        expected = self.require_api_key.encode()
        api_key = request.headers.get("x-api-key", "").encode()
        bearer = request.headers.get("authorization", "").encode()
        return secrets.compare_digest(api_key, expected) or secrets.compare_digest(
            bearer, b"Bearer " + expected
        )

    def _record(
        self,
        request: web.Request,
        request_id: str,
        body: Any,
        outcome: str,
        *,
        script: str | None = None,
        step: int | None = None,
    ) -> None:
        self._requests.append(
            RecordedRequest(
                arrived_at=time.time(),
                method=request.method,
                path=request.path,
                headers={name.lower(): value for name, value in request.headers.items()},
                body=body,
                request_id=request_id,
                script=script,
                step=step,
                outcome=outcome,
            )
        )

    # ------------------------------------------------------------------------------------------ planning

    def _plan(self, body: dict[str, Any]) -> _Plan:
        """Chooses what to serve from the request alone, plus the fault counters."""
        text = first_user_text(body)
        conversation = hashlib.sha256(text.encode()).hexdigest()[:16]
        step = assistant_turns(body)
        script = next((s for s in self._scripts if s.matches(text, body["model"])), None)
        if script is None:
            if not self.demo_brain:
                raise ProtocolError(
                    f"fake Messages API: no script matches model {body['model']!r} and first user message "
                    f"{text[:200]!r}, and the demo brain is off"
                )
            return _Plan(None, step, conversation, demo_reply(body), None)
        if step >= len(script.steps):
            raise ProtocolError(
                f"fake Messages API: script {script.key!r} has {len(script.steps)} step(s) but the request "
                f"holds {step} assistant message(s), asking for step {step}"
            )
        scripted = script.steps[step]
        if isinstance(scripted, Fault):
            return _Plan(script.key, step, conversation, Reply(), scripted)
        counter = (script.key, conversation, step)
        served = self._fault_counts.get(counter, 0)
        self._fault_counts[counter] = served + 1
        for fault in scripted.faults:
            if served < fault.times:
                return _Plan(script.key, step, conversation, scripted, fault)
            served -= fault.times
        return _Plan(script.key, step, conversation, scripted, None)

    def _wire_reply(self, body: Mapping[str, Any], plan: _Plan, *, max_tokens_cut: bool) -> WireReply:
        reply = plan.reply
        content: list[dict[str, Any]] = []
        for index, block in enumerate(reply.content):
            block = dict(block)
            if block["type"] == "tool_use" and "id" not in block:
                block = {
                    "type": "tool_use",
                    "id": derived_id("toolu", plan.conversation, plan.step, index),
                    **block,
                }
            content.append(block)
        output_tokens = reply.usage.output_tokens
        if output_tokens is None:
            output_tokens = estimate_tokens(content) if content else 1
        return WireReply(
            message_id=derived_id("msg", plan.conversation, plan.step),
            model=str(body["model"]),
            content=content,
            stop_reason="max_tokens" if max_tokens_cut else reply.wire_stop_reason,
            stop_sequence=None if max_tokens_cut else reply.stop_sequence,
            stop_details=None if max_tokens_cut else reply.stop_details,
            input_tokens=(
                reply.usage.input_tokens
                if reply.usage.input_tokens is not None
                else estimate_input_tokens(body)
            ),
            output_tokens=int(body["max_tokens"]) if max_tokens_cut else output_tokens,
            cache_creation_input_tokens=reply.usage.cache_creation_input_tokens,
            cache_read_input_tokens=reply.usage.cache_read_input_tokens,
        )

    # ------------------------------------------------------------------------------------------ serving

    async def _serve(
        self, request: web.Request, request_id: str, body: dict[str, Any], plan: _Plan
    ) -> web.StreamResponse:
        fault = plan.fault
        if isinstance(fault, HttpError):
            return _error(fault.status_code, fault.error_type, fault.error_message, request_id, fault.headers)
        if isinstance(fault, ConnectionReset) and fault.during == "headers":
            _reset(request)
            return web.Response(status=500)
        delay = self.latency_seconds + plan.reply.delay_seconds
        if isinstance(fault, SlowResponse):
            delay += fault.seconds
        if delay > 0:
            await asyncio.sleep(delay)
        headers = {"request-id": request_id, **plan.reply.headers}
        truncation = fault if isinstance(fault, TruncatedStream) else None
        wire = self._wire_reply(
            body, plan, max_tokens_cut=truncation is not None and truncation.mode == "max_tokens"
        )
        if body.get("stream") is True:
            return await self._serve_stream(request, headers, wire, plan, request_id)
        if isinstance(fault, StreamError):
            status = ERROR_STATUS.get(fault.error_type, 500)
            return _error(status, fault.error_type, fault.error_message, request_id)
        message = wire.message()
        if truncation is not None and truncation.mode == "max_tokens":
            message["content"] = truncated_content(wire.content, truncation.keep)
        payload = json.dumps(message, ensure_ascii=False).encode()
        if isinstance(fault, ConnectionReset) or (truncation is not None and truncation.mode == "cut"):
            return await self._serve_partial_json(
                request, headers, payload, reset=isinstance(fault, ConnectionReset)
            )
        return web.Response(body=payload, content_type="application/json", headers=headers)

    async def _serve_stream(
        self, request: web.Request, headers: dict[str, str], wire: WireReply, plan: _Plan, request_id: str
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
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
            }
        )
        await response.prepare(request)
        chunk_delay = plan.reply.chunk_delay_seconds
        if chunk_delay > 0:
            for event in events:
                await response.write(sse(event))
                await asyncio.sleep(chunk_delay)
        else:
            await response.write(b"".join(sse(event) for event in events))
        if isinstance(fault, ConnectionReset):
            await asyncio.sleep(RESET_GRACE_SECONDS)
            _reset(request)
            return response
        await response.write_eof()
        return response

    async def _serve_partial_json(
        self, request: web.Request, headers: dict[str, str], payload: bytes, *, reset: bool
    ) -> web.StreamResponse:
        """Announces the whole body, sends half of it, then drops the connection: with a reset (RST) for a
        connection fault, with a clean close (FIN) for a cut body."""
        response = web.StreamResponse(headers={**headers, "content-type": "application/json"})
        response.content_length = len(payload)
        await response.prepare(request)
        await response.write(payload[: len(payload) // 2])
        await asyncio.sleep(RESET_GRACE_SECONDS)
        if reset:
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


def _error(
    status: int, error_type: str, message: str, request_id: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(
        error_body(error_type, message, request_id),
        status=status,
        headers={"request-id": request_id, **(headers or {})},
    )


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
