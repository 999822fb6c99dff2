"""Calling the Messages API through the real SDK, and translating its errors exactly once.

A request is sent without streaming whenever the SDK would send it so (`needs_streaming`): one JSON
body, read into the answer without building the SDK's typed ``Message``, costs the least client and
server CPU per round trip (bench/RESULTS.md, loop overhead). A request the SDK refuses to send without
streaming (a ``max_tokens`` whose answer may take longer than ten minutes, or above a model's
non-streaming limit) is streamed: long answers stay possible, and an overloaded error that arrives
inside a 200 stream is seen (the SDK's event stream raises it as a plain APIStatusError). The SDK's own
retries are off (max_retries=0): the loop owns the single retry layer.

A streamed request is a raw ``create(stream=True)`` whose events the SDK hands over as decoded JSON,
folded into the answer by `streaming.StreamedMessage`; the SDK's ``messages.stream`` helper would build
the same answer, but it rebuilds a typed snapshot of the message on every event.

A stream that ends before `message_stop` (a proxy or server dropping the body cleanly) is not an
answer: it would hold a `stop_reason` of None and partial tool input, so it is retried like a
dropped connection; so is a JSON body cut short. A server that ignores `stream: true` and answers with
one JSON body is read as that body, so any server speaking the Messages API works.
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import anthropic
import httpx2
from anthropic._constants import MODEL_NONSTREAMING_TOKENS

from agentrun.loop.errors import FatalModelError, ModelCallError, RetryableModelError, RetryClass
from agentrun.loop.protocols import Message, ModelRequest, ModelResponse, ServerContextEdits
from agentrun.model.streaming import StreamedMessage, applied_edits, finished_block, token_usage

CONTEXT_TOO_LONG = re.compile(r"prompt is too long|context (window|length)|too many tokens", re.I)
SPEND_LIMIT = re.compile(r"credit balance|spend(ing)? limit|billing|usage limit", re.I)


#: The Messages API refuses a request with more cache breakpoints than this (system, tools and
#: message blocks together).
MAX_CACHE_BREAKPOINTS = 4
#: Blocks the API does not let carry cache_control (they are cached as part of the prefix anyway).
UNMARKABLE_BLOCKS = frozenset({"thinking", "redacted_thinking"})
INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
#: The betas of server-side context management: clearing tool results (context editing), compaction.
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
COMPACTION_BETA = "compact-2026-01-12"
#: The SDK refuses a non-streaming request whose answer may take longer than this; it expects
#: ``max_tokens`` to take up to an hour per 128,000 tokens.
NON_STREAMING_SECONDS = 10 * 60
TOKENS_PER_HOUR = 128_000
#: The SDK client's ``open_telemetry`` option: no spans of its own, no trace headers (see ClientPool).
SDK_TRACING_OFF: anthropic.OpenTelemetryOptions = {"traces": False, "propagation": False}


def needs_streaming(model: str, max_tokens: int, *, read_timeout: float = NON_STREAMING_SECONDS) -> bool:
    """Whether the SDK would refuse this request without streaming (the same rule as its own check),
    or its answer may take longer than the client waits for a read: a non-streamed answer sends
    nothing until it is complete, a streamed one keeps sending events."""
    limit = MODEL_NONSTREAMING_TOKENS.get(model)
    if limit is not None and max_tokens > limit:
        return True
    expected = 60 * 60 * max_tokens / TOKENS_PER_HOUR
    return expected > min(NON_STREAMING_SECONDS, read_timeout)


def build_params(request: ModelRequest) -> dict[str, Any]:
    """The request body: system prompt and tool list marked once each, the conversation as
    `with_cache_breakpoints` marks it, and thinking as the spec asks for it."""
    breakpoints = 0
    params: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens}
    if request.system:
        params["system"] = [{"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}]
        breakpoints += 1
    if request.tools:
        tools = [tool.as_api() for tool in request.tools]
        tools[-1]["cache_control"] = {"type": "ephemeral"}
        params["tools"] = tools
        breakpoints += 1
    params["messages"] = with_cache_breakpoints(request.messages, MAX_CACHE_BREAKPOINTS - breakpoints)
    betas: list[str] = []
    extra_body: dict[str, Any] = {}
    if request.thinking is not None:
        params["thinking"] = {"type": "enabled", "budget_tokens": request.thinking.budget_tokens}
        if request.thinking.interleaved and request.tools:
            betas.append(INTERLEAVED_THINKING_BETA)
    if request.server_context is not None:
        edits, edit_betas = context_edits(request.server_context)
        if edits:
            # The non-beta create() has no context_management argument; the body field is the beta's.
            extra_body["context_management"] = {"edits": edits}
            betas.extend(edit_betas)
    if request.tool_choice is not None:
        params["tool_choice"] = dict(request.tool_choice)
    if request.temperature is not None:
        # The SDK (2.12) has no temperature argument any more; the body field is still the API's.
        extra_body["temperature"] = request.temperature
    if extra_body:
        params["extra_body"] = extra_body
    if betas:
        params["extra_headers"] = {"anthropic-beta": ",".join(betas)}
    if request.stop_sequences:
        params["stop_sequences"] = list(request.stop_sequences)
    if request.user_id:
        params["metadata"] = {"user_id": request.user_id}
    return params


def context_edits(server: ServerContextEdits) -> tuple[list[dict[str, Any]], list[str]]:
    """spec.context's Server parts as the API's edits, and the beta headers they need.

    Clearing: tool uses beyond the newest `clear_keep` once the request holds `clear_trigger` of
    them (keepNewest + batch: the client's batching, so the cached prefix stays valid for turns).
    Compaction: at `compact_trigger_tokens` input tokens (the window times thresholdPercent), or
    at the API's own default when the window is unknown.
    """
    edits: list[dict[str, Any]] = []
    betas: list[str] = []
    if server.clear_keep is not None:
        edit: dict[str, Any] = {
            "type": "clear_tool_uses_20250919",
            "keep": {"type": "tool_uses", "value": server.clear_keep},
        }
        if server.clear_trigger is not None:
            edit["trigger"] = {"type": "tool_uses", "value": server.clear_trigger}
        edits.append(edit)
        betas.append(CONTEXT_MANAGEMENT_BETA)
    if server.compact:
        compact: dict[str, Any] = {"type": "compact_20260112"}
        if server.compact_trigger_tokens is not None:
            compact["trigger"] = {"type": "input_tokens", "value": server.compact_trigger_tokens}
        edits.append(compact)
        betas.append(COMPACTION_BETA)
    return edits, betas


def with_cache_breakpoints(messages: Sequence[Message], slots: int) -> list[Message]:
    """The messages to send, the conversation read from cache up to the newest message.

    The cached prefix is tools, system, then messages. The newest message is the last one of this
    request and the end of the next request's unchanged prefix (clearing old tool results or
    compaction may change earlier messages, never the newest): its breakpoint writes the cache the
    next turn reads. The API looks for an earlier cache entry only about 20 blocks
    back from a breakpoint, and a turn of many parallel tool calls adds more than that, so the last
    message of the previous request (the one before the newest assistant message) keeps a
    breakpoint too, where that cache was written. System and tool list keep theirs, so a compacted
    conversation still reads them from cache. Marks go on copies: the loop's state is never changed.
    """
    chosen = [len(messages) - 1] if messages else []
    answered = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), 0
    )
    if answered > 0:
        chosen.append(answered - 1)
    marked = list(messages)
    for index in chosen[: max(slots, 0)]:
        message = _marked(marked[index])
        if message is not None:
            marked[index] = message
    return marked


def _marked(message: Message) -> Message | None:
    """A copy of the message whose last markable block carries a breakpoint; None when it has none."""
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        return {
            **message,
            "content": [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}],
        }
    if not isinstance(content, list):
        return None
    for position in range(len(content) - 1, -1, -1):
        block = content[position]
        if not isinstance(block, dict) or block.get("type") in UNMARKABLE_BLOCKS:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue
        blocks = list(content)
        blocks[position] = {**block, "cache_control": {"type": "ephemeral"}}
        return {**message, "content": blocks}
    return None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


def translate(exc: Exception) -> ModelCallError:
    """Map an SDK/transport failure to the loop's error classes. Messages never carry the key."""
    if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
        return RetryableModelError("the Messages API did not answer in time", retry_class=RetryClass.TIMEOUT)
    if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
        return RetryableModelError(
            f"connection to the Messages API failed: {type(exc).__name__}", retry_class=RetryClass.CONNECTION
        )
    if isinstance(exc, anthropic.APIStatusError):
        return _translate_status(exc)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return FatalModelError(
            f"unexpected response from the Messages API: {exc.message}", reason="ModelError"
        )
    return FatalModelError(f"{type(exc).__name__}: {exc}", reason="ModelError")


def _translate_status(exc: anthropic.APIStatusError) -> ModelCallError:
    status = exc.status_code
    api_message = exc.api_message or exc.message
    kind: str = exc.type or ""
    headers = exc.response.headers
    request_id = exc.request_id
    should_retry = headers.get("x-should-retry")
    retry_class: RetryClass | None = None
    if kind == "overloaded_error" or status == 529:
        retry_class = RetryClass.OVERLOADED
    elif kind == "rate_limit_error" or status == 429:
        retry_class = RetryClass.RATE_LIMITED
    elif status == 408:
        retry_class = RetryClass.TIMEOUT
    elif status >= 500 or kind == "api_error" or status == 409:
        retry_class = RetryClass.SERVER_ERROR
    if should_retry == "false":
        retry_class = None
    elif should_retry == "true" and retry_class is None:
        retry_class = RetryClass.SERVER_ERROR
    if retry_class is not None:
        return RetryableModelError(
            f"{kind or 'HTTP ' + str(status)}: {api_message}",
            retry_class=retry_class,
            retry_after=_retry_after(headers),
            status=status,
            request_id=request_id,
        )
    if status in (401, 403) or kind in ("authentication_error", "permission_error"):
        reason = "AuthenticationFailed"
    elif status == 402 or kind == "billing_error" or SPEND_LIMIT.search(api_message):
        reason = "SpendLimitReached"
    elif status == 413 or kind == "request_too_large":
        reason = "RequestTooLarge"
    elif status == 404 or kind == "not_found_error":
        reason = "ModelNotFound"
    elif status == 429 or kind == "rate_limit_error":
        reason = "RateLimited"  # only when the server said not to retry (x-should-retry: false)
    elif status >= 500:
        reason = "ModelError"  # likewise: a server error the server itself said not to retry
    else:
        reason = "InvalidModelRequest"
    too_long = status == 400 and bool(CONTEXT_TOO_LONG.search(api_message))
    return FatalModelError(
        f"{kind or 'error'}: {api_message}",
        reason=reason,
        status=status,
        request_id=request_id,
        context_window_exceeded=too_long,
    )


class AnthropicModel:
    """A ModelClient over one AsyncAnthropic client (shared by the runs of one pool shard).

    ``always_stream`` streams every request, as the adapter did before it sent requests without
    streaming where the SDK allows it; tests of the stream path use it.
    """

    def __init__(self, client: anthropic.AsyncAnthropic, *, always_stream: bool = False) -> None:
        self._client = client
        self._always_stream = always_stream
        timeout = client.timeout
        read = timeout.read if isinstance(timeout, httpx2.Timeout) else timeout
        self._read_timeout = float(read) if isinstance(read, int | float) else float(NON_STREAMING_SECONDS)

    @property
    def client(self) -> anthropic.AsyncAnthropic:
        return self._client

    async def complete(self, request: ModelRequest) -> ModelResponse:
        stream = self._always_stream or needs_streaming(
            request.model, request.max_tokens, read_timeout=self._read_timeout
        )
        try:
            async with self._client.messages.with_streaming_response.create(
                **build_params(request), stream=stream
            ) as raw:
                if not stream or raw.headers.get("content-type", "").startswith("application/json"):
                    return response_from_json(await raw.read(), raw.request_id)
                message = await read_events(raw)
        except (anthropic.AnthropicError, httpx2.TransportError) as exc:
            raise translate(exc) from exc
        return message.response()


async def read_events(raw: anthropic.AsyncAPIResponse[Any]) -> StreamedMessage:
    """Events parsed as `object` are handed over as their decoded JSON, with no model built for each;
    the SDK still skips pings and raises an `error` event as an APIStatusError."""
    message = StreamedMessage(raw.request_id)
    try:
        async for event in await raw.parse(to=anthropic.AsyncStream[object]):
            message.add(event)
    except json.JSONDecodeError as exc:
        raise FatalModelError(
            "unexpected response from the Messages API: an event that is not JSON",
            reason="ModelError",
            request_id=raw.request_id,
        ) from exc
    return message


def response_from_json(body: bytes, request_id: str | None) -> ModelResponse:
    """A whole Message body, from a server that does not stream; read leniently like the SDK does."""
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise RetryableModelError(
            "the Messages API sent a body that is not JSON (cut off?)",
            retry_class=RetryClass.CONNECTION,
            request_id=request_id,
        ) from exc
    if (
        not isinstance(data, dict)
        or data.get("type") != "message"
        or not isinstance(data.get("content"), list)
    ):
        raise FatalModelError(
            "unexpected response from the Messages API: not a message",
            reason="ModelError",
            request_id=request_id,
        )
    details = data.get("stop_details")
    content = [finished_block(block) for block in data["content"] if isinstance(block, dict)]
    return ModelResponse(
        content=content,
        stop_reason=data.get("stop_reason") if isinstance(data.get("stop_reason"), str) else None,
        stop_sequence=data.get("stop_sequence") if isinstance(data.get("stop_sequence"), str) else None,
        usage=token_usage(data.get("usage")),
        model=str(data.get("model") or ""),
        request_id=request_id,
        stop_details=details if isinstance(details, dict) else None,
        context_edits=applied_edits(content, data.get("context_management"), data.get("usage")),
    )


class ClientPool:
    """SDK clients per (base URL, key, shard): connections are reused, keys never logged.

    The clients send over the SDK's aiohttp transport (``DefaultAioHttpClient``): at scale it costs
    less operator CPU per request than httpx's own (bench/RESULTS.md, operator at scale);
    ``transport="httpx"`` is the SDK's default, kept for comparison. Runs are spread over a few clients
    by a stable shard key (the run's uid): with one client, every request scans one large connection
    pool, which costs CPU that grows with concurrent runs.

    The SDK's own OpenTelemetry spans are off: the operator traces each model request itself
    (tracing/observing.py, to its own provider), and the SDK's span goes to the global provider, a no-op
    in the operator, yet the SDK still builds its attributes and trace headers on every request (3% of
    the operator's CPU at 1000 runs); no trace context is sent to the Messages API either.
    """

    def __init__(
        self,
        *,
        timeout_seconds: float = 600.0,
        max_connections: int = 2000,
        shards: int = 8,
        transport: Literal["aiohttp", "httpx"] = "aiohttp",
    ) -> None:
        self._clients: dict[tuple[str | None, str, int], anthropic.AsyncAnthropic] = {}
        # One TLS context for every client: loading the CA bundle costs tens of ms of CPU each time.
        self._tls: ssl.SSLContext | None = None
        self._timeout = timeout_seconds
        self._shards = max(shards, 1)
        self._max_connections = max(max_connections // self._shards, 1)
        self._transport = transport

    def model(self, *, api_key: str, base_url: str | None, shard_key: str = "") -> AnthropicModel:
        fingerprint = hashlib.sha256(api_key.encode()).hexdigest()
        shard = int(hashlib.sha256(shard_key.encode()).hexdigest()[:8], 16) % self._shards
        key = (base_url, fingerprint, shard)
        client = self._clients.get(key)
        if client is None:
            client = anthropic.AsyncAnthropic(
                api_key=api_key,
                base_url=base_url,
                max_retries=0,
                timeout=self._timeout,
                http_client=self._http_client(),
                open_telemetry=SDK_TRACING_OFF,
            )
            self._clients[key] = client
        return AnthropicModel(client)

    def _http_client(self) -> httpx2.AsyncClient:
        limits = httpx2.Limits(
            max_connections=self._max_connections,
            max_keepalive_connections=min(200, self._max_connections),
        )
        if self._transport == "httpx":
            return anthropic.DefaultAsyncHttpxClient(verify=self._tls_context(), limits=limits)
        # Proxies from the environment apply as with httpx: the client resolves them once, when built.
        return anthropic.DefaultAioHttpClient(verify=self._tls_context(), limits=limits)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = httpx2.create_ssl_context()  # what verify=True builds, SSL_CERT_FILE included
        return self._tls

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
