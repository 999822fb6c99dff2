"""A non-streamed Messages API request sent over aiohttp directly, byte for byte as the SDK sends it.

Why: for every request the SDK builds an httpx2 Request, its Headers and URL, and runs its options,
retry and middleware layers, then hands the request to its aiohttp transport, which turns it back into
an aiohttp call; at 1000 runs the SDK and httpx2 were a fifth of the operator's CPU (issue #32). This
client sends the same request (the URL, the headers, taken once from the SDK client itself so they stay
what the installed SDK sends, and the body, `build_params` serialized as the SDK serializes it, by
agentrun/json_text.py: a float with a small exponent is written ``1e-7`` where the SDK writes
``1e-07``, the same number; a NaN or infinity refused as the SDK refuses it) over the operator's own
HTTP/1.1 client (agentrun/posting.py, about half aiohttp's CPU per request), one per pool shard, with
what the SDK's aiohttp transport takes from the client: the pool's TLS context, the same connection
limit, keep-alive and timeouts. Where the SDK's HTTP client chose a proxy from the environment the
request goes over an aiohttp session through that proxy instead, as the SDK's transport sends it.
Every failure goes through the same translation as the SDK path (translating). Streamed requests stay
on the SDK (anthropic_calling).

tests/unit/model/test_direct_client.py compares what a server receives from both paths.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp
import anthropic
import httpx2
from anthropic._constants import RAW_RESPONSE_HEADER
from yarl import URL

from agentrun import json_text
from agentrun.loop.protocols import ModelResponse
from agentrun.model.translating import connection_failed, response_from_json, status_error, timed_out
from agentrun.posting import CODINGS, Poster, Timeouts

#: The fields build_params may set, in the order the SDK's ``messages.create`` puts them in the body;
#: ``extra_body``'s fields follow them, as the SDK merges it last.
SDK_BODY_ORDER = (
    "max_tokens", "messages", "model", "metadata", "stop_sequences", "stream", "system", "thinking",
    "tool_choice", "tools",
)  # fmt: skip


def request_body(params: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
    """`build_params` as the SDK sends it without streaming: the body (its own fields in its order,
    ``stream: false``, then extra_body's) and the extra headers (the betas)."""
    fields = {**params, "stream": False}
    body = {name: fields[name] for name in SDK_BODY_ORDER if name in fields}
    unknown = fields.keys() - body.keys() - {"extra_body", "extra_headers"}
    if unknown:
        raise TypeError(f"not a Messages API field the direct client sends: {sorted(unknown)}")
    body.update(params.get("extra_body") or {})
    extra = {name.lower(): value for name, value in (params.get("extra_headers") or {}).items()}
    return json_text.encode(body, allow_nan=False), extra


def sdk_headers(client: anthropic.AsyncAnthropic, http_client: httpx2.AsyncClient) -> dict[str, str]:
    """The headers the SDK sends with a request of `AnthropicModel` (a raw-response call, no per-request
    timeout, first attempt), in the SDK's layers: its HTTP client's defaults, the per-request
    x-stainless ones, the client's default headers (auth, anthropic-version, user agent, platform),
    then the raw-response call's marker. Names lower-cased, as httpx2 sends them."""
    timeout = client.timeout
    read = timeout.read if isinstance(timeout, httpx2.Timeout) else timeout
    per_request = {
        "x-stainless-timeout": str(anthropic.NOT_GIVEN),
        "x-stainless-retry-count": "0",
        **({"x-stainless-read-timeout": str(read)} if read is not None else {}),
    }
    headers: dict[str, str] = {}
    layers: tuple[Mapping[str, object], ...] = (
        dict(http_client.headers),
        per_request,
        client.default_headers,
        {RAW_RESPONSE_HEADER: "stream"},
    )
    for layer in layers:
        for name, value in layer.items():
            headers.pop(name.lower(), None)
            if isinstance(value, str):  # an Omit removes the header
                headers[name.lower()] = value
    return headers


class DirectMessages:
    """POST /v1/messages without streaming for the runs of one pool shard.

    Headers are read from the SDK client at the first request, inside the event loop: the SDK names the
    async library in one of them. The session is made then too, as aiohttp wants a running loop.
    """

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        http_client: httpx2.AsyncClient,
        *,
        tls: ssl.SSLContext,
        limits: httpx2.Limits,
    ) -> None:
        base = client.base_url
        url = base.copy_with(raw_path=base.raw_path + b"v1/messages")  # as the SDK's _prepare_url
        self._url = URL(str(url), encoded=True)
        # The host's SNI name, as the SDK sends it (its workaround for hosts with underscores).
        self._server_hostname = url.host.replace("_", "-") if "_" in url.host else None
        self._client = client
        self._http_client = http_client
        self._tls = tls
        self._limits = limits
        timeout = client.timeout
        if not isinstance(timeout, httpx2.Timeout):
            timeout = httpx2.Timeout(timeout)
        # What the SDK's aiohttp transport makes of the client's timeout: no total, per phase.
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeout.connect, sock_read=timeout.read, connect=timeout.pool
        )
        self._proxy = _proxy_arguments(http_client, url)
        self._headers: dict[str, str] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._poster: Poster | None = None
        self._path = self._url.raw_path_qs
        self._phases = Timeouts(pool=timeout.pool, connect=timeout.connect, read=timeout.read)

    async def create(self, params: Mapping[str, Any]) -> ModelResponse:
        body, extra = request_body(params)
        if self._headers is None:
            self._headers = sdk_headers(self._client, self._http_client)
            self._poster = self._lean(self._headers)
        headers = {**self._headers, **extra} if extra else self._headers
        if self._poster is None:
            return await self._create_over_aiohttp(body, headers)
        try:
            answer = await self._poster.post(self._path, headers, body)
        except TimeoutError as exc:  # TimeoutErrors are OSErrors too: first
            raise timed_out() from exc
        except OSError as exc:
            raise connection_failed(type(exc).__name__) from exc
        if not 200 <= answer.status < 300:
            raise status_error(answer.status, answer.body, answer.charset, answer.headers)
        return response_from_json(answer.body, answer.headers.get("request-id"))

    def _lean(self, headers: Mapping[str, str]) -> Poster | None:
        """The lean client (posting), decided once with the SDK's headers: none when a proxy is in the
        way or the headers ask for a content coding it does not read; then every request of this shard
        goes over aiohttp."""
        codings = {c.split(";")[0].strip().lower() for c in headers.get("accept-encoding", "").split(",")}
        if self._proxy or not codings <= CODINGS | {""}:
            return None
        limit = self._limits.max_connections
        return Poster(
            self._url.origin(),
            tls=self._tls,
            server_hostname=self._server_hostname,
            limit=100 if limit is None else limit,
            keepalive=self._limits.keepalive_expiry,
            timeouts=self._phases,
        )

    async def _create_over_aiohttp(self, body: bytes, headers: Mapping[str, str]) -> ModelResponse:
        try:
            async with self._open().post(
                self._url,
                data=body,
                headers=headers,
                timeout=self._timeout,
                server_hostname=self._server_hostname,
                **self._proxy,
            ) as response:
                content = await response.read()
        except TimeoutError as exc:  # aiohttp's timeouts are TimeoutErrors, also OSErrors: first
            raise timed_out() from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise connection_failed(type(exc).__name__) from exc
        if not 200 <= response.status < 300:
            raise status_error(response.status, content, response.charset, response.headers)
        return response_from_json(content, response.headers.get("request-id"))

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            limit = self._limits.max_connections
            connector = aiohttp.TCPConnector(
                ssl=self._tls,
                keepalive_timeout=self._limits.keepalive_expiry,
                limit=100 if limit is None else limit,  # aiohttp's default, which the SDK's client keeps
            )
            # Proxies are the ones the SDK's client resolved once from the environment (_proxy_arguments),
            # not aiohttp's trust_env, which reads them per request and ~/.netrc besides.
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._poster is not None:
            await self._poster.close()
            self._poster = None
            self._headers = None  # a request after this decides its wire again
        if self._session is not None:
            await self._session.close()
            self._session = None


def _proxy_arguments(http_client: httpx2.AsyncClient, url: httpx2.URL) -> dict[str, Any]:
    """The proxy the SDK's HTTP client would send this URL through (HTTPS_PROXY, NO_PROXY and the rest,
    read when it was built), as its aiohttp transport passes it on; none when it sends it direct."""
    proxy = getattr(http_client._transport_for_url(url), "proxy", None)
    if not isinstance(proxy, httpx2.Proxy):
        return {}
    return {
        "proxy": str(proxy.url),
        "proxy_auth": aiohttp.BasicAuth(proxy.auth[0], proxy.auth[1]) if proxy.auth else None,
        "proxy_headers": dict(proxy.headers),
    }
