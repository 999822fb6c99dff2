"""Calling the Messages API through the real SDK or, without streaming, the direct client over the same
transport (direct_calling); errors are translated exactly once, the same way for both (translating).

A request is sent without streaming whenever the SDK would send it so (`needs_streaming`): one JSON
body, read into the answer without building the SDK's typed ``Message``, costs the least client and
server CPU per round trip (bench/RESULTS.md, loop overhead). The pool's clients send such a request
through `DirectMessages` (the SDK's wire form, without its per-request layers; AGENTRUN_MODEL_CLIENT=sdk
sends it through the SDK as before). A request the SDK refuses to send without
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
import ssl
from typing import Any, Literal

import anthropic
import httpcore2  # noqa: F401  # imported by httpx2 on the first TLS context; at import time, not in a run
import httpx2

from agentrun.loop.errors import FatalModelError
from agentrun.loop.protocols import ModelRequest, ModelResponse
from agentrun.model.access import ModelAccess
from agentrun.model.cloud_clients import MessagesClient, cloud_client, sign_in_failed
from agentrun.model.direct_calling import DirectMessages
from agentrun.model.params import NON_STREAMING_SECONDS, build_params, needs_streaming
from agentrun.model.streaming import StreamedMessage
from agentrun.model.translating import response_from_json, translate

#: The SDK client's ``open_telemetry`` option: no spans of its own, no trace headers (see ClientPool).
SDK_TRACING_OFF: anthropic.OpenTelemetryOptions = {"traces": False, "propagation": False}

__all__ = [
    "AnthropicModel", "ClientPool", "build_params", "needs_streaming", "response_from_json", "translate",
]  # fmt: skip


class AnthropicModel:
    """A ModelClient over one SDK client (shared by the runs of one pool shard): Anthropic's, Bedrock's
    or Vertex AI's, whose requests and answers are the Messages API's in each provider's wire form.

    ``always_stream`` streams every request, as the adapter did before it sent requests without
    streaming where the SDK allows it; tests of the stream path use it. With ``direct``, a request sent
    without streaming goes through it instead of the SDK.
    """

    def __init__(
        self,
        client: MessagesClient,
        *,
        always_stream: bool = False,
        direct: DirectMessages | None = None,
    ) -> None:
        self._client = client
        self._always_stream = always_stream
        self._direct = direct
        timeout = client.timeout
        read = timeout.read if isinstance(timeout, httpx2.Timeout) else timeout
        self._read_timeout = float(read) if isinstance(read, int | float) else float(NON_STREAMING_SECONDS)

    @property
    def client(self) -> MessagesClient:
        return self._client

    async def complete(self, request: ModelRequest) -> ModelResponse:
        stream = self._always_stream or needs_streaming(
            request.model, request.max_tokens, read_timeout=self._read_timeout
        )
        if not stream and self._direct is not None:
            return await self._direct.create(build_params(request))
        try:
            async with self._client.messages.with_streaming_response.create(
                **build_params(request), stream=stream
            ) as raw:
                if not stream or raw.headers.get("content-type", "").startswith("application/json"):
                    return response_from_json(await raw.read(), request_id_of(raw))
                message = await read_events(raw)
        except (anthropic.AnthropicError, httpx2.TransportError) as exc:
            raise translate(exc) from exc
        except Exception as exc:
            if (failed := sign_in_failed(exc)) is not None:
                raise failed from exc
            raise
        return message.response()


def request_id_of(raw: anthropic.AsyncAPIResponse[Any]) -> str | None:
    """Anthropic's request-id, or Bedrock's x-amzn-RequestId (what AWS support asks for)."""
    return raw.request_id or raw.headers.get("x-amzn-requestid")


async def read_events(raw: anthropic.AsyncAPIResponse[Any]) -> StreamedMessage:
    """Events parsed as `object` are handed over as their decoded JSON, with no model built for each;
    the SDK still skips pings and raises an `error` event (a Bedrock exception frame too) as an
    APIStatusError."""
    message = StreamedMessage(request_id_of(raw))
    try:
        async for event in await raw.parse(to=anthropic.AsyncStream[object]):
            message.add(event)
    except json.JSONDecodeError as exc:
        raise FatalModelError(
            "unexpected response from the Messages API: an event that is not JSON",
            reason="ModelError",
            request_id=request_id_of(raw),
        ) from exc
    return message


class ClientPool:
    """Clients per (provider, endpoint, credentials, shard): connections are reused, keys never logged.

    ``client="direct"`` (the default, AGENTRUN_MODEL_CLIENT) sends requests without streaming through
    `DirectMessages` over aiohttp, as the SDK's aiohttp client would send them but without its
    per-request layers (issue #32: they were a fifth of the operator's CPU at 1000 runs); streamed requests
    and ``client="sdk"`` go through the SDK. The SDK clients send over the SDK's aiohttp transport
    (``DefaultAioHttpClient``): at scale it costs less operator CPU per request than httpx's own
    (bench/RESULTS.md, operator at scale); ``transport="httpx"`` is the SDK's default, kept for
    comparison. Runs are spread over a few clients by a stable shard key (the run's uid): with one
    client, every request scans one large connection pool, which costs CPU that grows with concurrent
    runs.

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
        client: Literal["direct", "sdk"] = "direct",
    ) -> None:
        self._clients: dict[tuple[str, int], AnthropicModel] = {}
        self._direct: list[DirectMessages] = []
        # One TLS context for every client: loading the CA bundle costs tens of ms of CPU each time.
        self._tls: ssl.SSLContext | None = None
        self._timeout = timeout_seconds
        self._shards = max(shards, 1)
        self._max_connections = max(max_connections // self._shards, 1)
        self._transport = transport
        self._client_kind = client

    def model(self, access: ModelAccess, *, shard_key: str = "") -> AnthropicModel:
        shard = int(hashlib.sha256(shard_key.encode()).hexdigest()[:8], 16) % self._shards
        key = (access.fingerprint(), shard)
        model = self._clients.get(key)
        if model is None:
            model = self._clients[key] = self._new_model(access)
        return model

    def _new_model(self, access: ModelAccess) -> AnthropicModel:
        limits = httpx2.Limits(
            max_connections=self._max_connections,
            max_keepalive_connections=min(200, self._max_connections),
        )
        http_client = self._http_client(limits)
        if access.provider != "anthropic":
            # Each cloud's signing and URL layout is the SDK's (per request): no direct client.
            return AnthropicModel(
                cloud_client(
                    access, http_client=http_client, timeout=self._timeout, telemetry=SDK_TRACING_OFF
                )
            )
        client = anthropic.AsyncAnthropic(
            api_key=access.api_key,
            base_url=access.base_url,
            max_retries=0,
            timeout=self._timeout,
            http_client=http_client,
            open_telemetry=SDK_TRACING_OFF,
        )
        # A client whose auth the SDK works out per request (a credentials provider) stays on the SDK.
        if self._client_kind == "sdk" or client.custom_auth is not None:
            return AnthropicModel(client)
        direct = DirectMessages(client, http_client, tls=self._tls_context(), limits=limits)
        self._direct.append(direct)
        return AnthropicModel(client, direct=direct)

    def _http_client(self, limits: httpx2.Limits) -> httpx2.AsyncClient:
        if self._transport == "httpx":
            return anthropic.DefaultAsyncHttpxClient(verify=self._tls_context(), limits=limits)
        # Proxies from the environment apply as with httpx: the client resolves them once, when built.
        return anthropic.DefaultAioHttpClient(verify=self._tls_context(), limits=limits)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = httpx2.create_ssl_context()  # what verify=True builds, SSL_CERT_FILE included
        return self._tls

    async def close(self) -> None:
        for direct in self._direct:
            await direct.close()
        for model in self._clients.values():
            await model.client.close()
        self._clients.clear()
        self._direct.clear()
