"""A scripted fake of the Anthropic Messages API, served over real HTTP for the real ``anthropic`` SDK.

Tests, benchmarks and the offline demo point ``AsyncAnthropic(base_url=api.url)`` at it, so the operator's
model adapter, the SDK's parsing, streaming and retry code all run for real; only the model is scripted.

In-process::

    async with FakeMessagesAPI(scripts=[...]).running(host="127.0.0.1", port=0) as api:
        client = anthropic.AsyncAnthropic(api_key="test", base_url=api.url, max_retries=0)

As a child process (prints one line ``READY http://127.0.0.1:PORT``, serves until SIGTERM or SIGINT)::

    python -m agentrun_sandbox.messages.server --port 0 [--script FILE]... [--latency SECONDS]
        [--require-api-key KEY] [--no-demo-brain] [--access-log] [--prompt-cache]

Routes: ``POST /v1/messages`` (JSON or ``"stream": true`` SSE), ``POST /v1/messages/count_tokens``,
``GET /healthz``; Amazon Bedrock's InvokeModel and Google Vertex AI's rawPredict, each with its
cloud's sign-in and wire form (:mod:`~agentrun_sandbox.messages.cloud_doors`); anything else is a 404
``not_found_error``. Every response carries a ``request-id`` (``x-amzn-RequestId`` from Bedrock).

What a request gets, in order: 401 ``authentication_error`` if ``require_api_key`` is set and neither
``x-api-key`` nor ``Authorization: Bearer`` carries it; 400 ``invalid_request_error`` for a body the real API
would reject (see :mod:`~agentrun_sandbox.messages.protocol`; also recorded in :attr:`protocol_errors`);
then the first script whose ``match``/``model`` fits, at the step given by the number of assistant messages
in the request (400 if the script has no such step); else the demo brain
(:mod:`~agentrun_sandbox.messages.brain`), or 400 when it is switched off.

``context_management`` (server-side clearing and compaction, with their beta headers) is done as the
real API's betas do it (:mod:`~agentrun_sandbox.messages.context_editing`); what it did is in
:attr:`context_edits`.

``prompt_cache`` keeps prompt caching as the real API does (:mod:`~agentrun_sandbox.messages.caching`):
usage a script leaves out then splits the input into cache reads, cache writes and the rest.

``latency_seconds`` delays every model response (replies, brain answers, and the faults that imitate a
model response: stream errors, truncations, resets during the body, slow responses) before its headers,
with a plain ``asyncio.sleep``, so a thousand concurrent slow requests cost next to nothing. HTTP error
faults, resets before the headers, 401 and 400 answers are immediate.

This module routes and rejects; :mod:`~agentrun_sandbox.messages.planning` chooses the answer,
:mod:`~agentrun_sandbox.messages.serving` delivers it (JSON, SSE, wire faults) and
:mod:`~agentrun_sandbox.messages.recording` keeps the log tests read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import secrets
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from aiohttp import web

from agentrun_sandbox.messages import context_editing
from agentrun_sandbox.messages.caching import PromptCache
from agentrun_sandbox.messages.cloud_auth import AwsAccount, GoogleAccount
from agentrun_sandbox.messages.cloud_doors import CloudDoors
from agentrun_sandbox.messages.dialects import ANTHROPIC, Dialect
from agentrun_sandbox.messages.planning import FaultCounts, plan
from agentrun_sandbox.messages.protocol import ProtocolError, assistant_turns, validate_request
from agentrun_sandbox.messages.recording import Bill, RecordedRequest, RequestLog
from agentrun_sandbox.messages.script import Script
from agentrun_sandbox.messages.serving import error_response, serve
from agentrun_sandbox.messages.wire import estimate_input_tokens, new_request_id

__all__ = ["Bill", "FakeMessagesAPI", "RecordedRequest"]


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
        prompt_cache: bool = False,
        aws: AwsAccount | None = None,
        google: GoogleAccount | None = None,
    ) -> None:
        self.aws = aws or AwsAccount()
        """Bedrock's sign-in: the keys and web identities it accepts (see cloud_auth)."""
        self.google = google or GoogleAccount()
        """Vertex AI's sign-in: the project, location and service accounts whose tokens it accepts."""
        self._scripts: list[Script] = list(scripts)
        self._prompt_cache = PromptCache() if prompt_cache else None
        self.require_api_key = require_api_key
        self.latency_seconds = latency_seconds
        self.demo_brain = demo_brain
        self._access_log = access_log
        self._log = RequestLog(max_recorded_requests)
        self._fault_counts: FaultCounts = {}
        self._compactions = context_editing.ServedCompactions()
        self.protocol_errors: list[str] = []
        """Every 400 this server answered with, so a test can assert the client kept to the protocol."""
        self.bills: list[Bill] = []
        """Every answer generated, with its usage: what the API would bill (kept until clear())."""
        self.context_edits: list[tuple[str | None, list[dict[str, Any]], bool]] = []
        """Per answer with server-side context management at work: (script, applied clear edits,
        whether it compacted)."""
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
        return list(self._log)

    def requests_for(self, match: str) -> list[RecordedRequest]:
        """Requests of one conversation family: the first user message contains ``match``, or the model or the
        answering script's key equals it."""
        return [r for r in self._log if match in r.first_user_text or match in (r.model, r.script)]

    def redacted_requests(self) -> list[RecordedRequest]:
        return [r.redacted() for r in self._log]

    def clear(self, *, faults: bool = True) -> None:
        """Forgets recorded requests and protocol errors, and by default the fault counters too, so the next
        request sees every scripted fault again."""
        self._log.clear()
        self.protocol_errors.clear()
        self.context_edits.clear()
        self.bills.clear()
        if faults:
            self._fault_counts.clear()
        self._compactions.clear()

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
        CloudDoors(self).register(app)
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
        self._log.record(request, request_id, body, "not_found")
        return error_response(
            404, "not_found_error", f"{request.method} {request.path} does not exist", request_id
        )

    async def _handle_count_tokens(self, request: web.Request) -> web.Response:
        request_id = new_request_id()
        body = await self._read_json(request)
        rejection = self._reject(request, request_id, body, count_tokens=True)
        if rejection is not None:
            return rejection
        self._log.record(request, request_id, body, "count_tokens")
        return web.json_response(
            {"input_tokens": estimate_input_tokens(body)}, headers={"request-id": request_id}
        )

    async def _handle_messages(self, request: web.Request) -> web.StreamResponse:
        request_id = new_request_id()
        body = await self._read_json(request)
        rejection = self._reject(request, request_id, body, count_tokens=False)
        if rejection is not None:
            return rejection
        return await self.answer(request, request_id, body, ANTHROPIC)

    async def answer(
        self, request: web.Request, request_id: str, body: dict[str, Any], dialect: Dialect
    ) -> web.StreamResponse:
        """A valid request's answer, in the wire form of the provider it came through."""
        edited = context_editing.apply(body)  # server-side context management: what the model reads
        try:
            chosen = plan(edited.body, self._scripts, self._fault_counts, demo_brain=self.demo_brain)
            self._compactions.check_kept(body, chosen.conversation, chosen.step - assistant_turns(body))
        except ProtocolError as err:
            self.protocol_errors.append(str(err))
            self._log.record(request, request_id, body, "invalid_request")
            return dialect.error(400, "invalid_request_error", str(err), request_id)
        if self._prompt_cache is not None and chosen.fault is None:
            chosen = dataclasses.replace(chosen, cache=self._prompt_cache.use(body))
        if chosen.fault is None and (edited.applied_edits or edited.compact):
            compaction = context_editing.compaction_block(body, chosen.step) if edited.compact else None
            chosen = dataclasses.replace(chosen, compaction=compaction, applied_edits=edited.applied_edits)
            if compaction is not None:
                self._compactions.add(chosen.conversation, chosen.step)
            self.context_edits.append((chosen.script, list(edited.applied_edits), compaction is not None))
        self._log.record(request, request_id, body, chosen.outcome, script=chosen.script, step=chosen.step)
        metadata = body.get("metadata") if isinstance(body, dict) else None
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None

        def bill(usage: Mapping[str, Any]) -> None:
            self.bills.append(Bill(request_id, user_id, str(body.get("model")), dict(usage)))

        return await serve(
            request,
            request_id,
            edited.body,
            chosen,
            latency_seconds=self.latency_seconds,
            bill=bill,
            dialect=dialect,
        )

    def record_refusal(self, request: web.Request, request_id: str, body: Any, outcome: str) -> None:
        self._log.record(request, request_id, body, outcome)

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
            self._log.record(request, request_id, body, "unauthorized")
            return error_response(401, "authentication_error", "invalid x-api-key", request_id)
        if "anthropic-version" not in request.headers:
            return self.refuse(request, request_id, body, "anthropic-version: header is required", ANTHROPIC)
        betas = {b.strip() for b in request.headers.get("anthropic-beta", "").split(",") if b.strip()}
        return self.invalid(request, request_id, body, betas, ANTHROPIC, count_tokens=count_tokens)

    def invalid(
        self,
        request: web.Request,
        request_id: str,
        body: Any,
        betas: set[str],
        dialect: Dialect,
        *,
        count_tokens: bool = False,
    ) -> web.Response | None:
        """A 400 for a body the real API would reject, in the provider's form; None for a valid one."""
        try:
            validate_request(body, count_tokens=count_tokens, betas=betas)
            context_editing.check_request(body, betas)
        except ProtocolError as err:
            return self.refuse(request, request_id, body, str(err), dialect)
        return None

    def refuse(
        self, request: web.Request, request_id: str, body: Any, why: str, dialect: Dialect
    ) -> web.Response:
        self.protocol_errors.append(why)
        self._log.record(request, request_id, body, "invalid_request")
        return dialect.error(400, "invalid_request_error", why, request_id)

    def _authorised(self, request: web.Request) -> bool:
        if self.require_api_key is None:
            return True
        expected = self.require_api_key.encode()
        api_key = request.headers.get("x-api-key", "").encode()
        bearer = request.headers.get("authorization", "").encode()
        return secrets.compare_digest(api_key, expected) or secrets.compare_digest(
            bearer, b"Bearer " + expected
        )
