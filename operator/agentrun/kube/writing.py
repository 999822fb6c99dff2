"""The writes every iteration makes (a status patch, a transcript Secret, an Event), sent over the lean
HTTP/1.1 client (agentrun/posting.py) instead of kubernetes_asyncio's aiohttp session.

Why: through aiohttp a write cost about twice the client CPU (docs/benchmarks.md, #32), and with the
Secret store a run makes about two writes per iteration. The request is the one kubernetes_asyncio's
REST layer sends: the same URL (the server's path prefix kept), the client's default headers and user
agent, credentials from the same ``update_params_for_auth`` (a rotating token is renewed there), the
same JSON body written compactly (agentrun/json_text.py), a TLS context built from the same
configuration as its own, the same timeouts (aiohttp's defaults: 30 s to connect, 300 s for the answer)
and connection limit. A client whose configuration names a proxy keeps the aiohttp session
(:meth:`LeanWrites.of` gives None). Failures are the typed errors of kube/errors.py, as
:func:`agentrun.kube.calling.call` raises them.
"""

from __future__ import annotations

import ssl
from typing import Any

from kubernetes_asyncio import client
from multidict import CIMultiDict
from yarl import URL

from agentrun import json_text
from agentrun.kube.errors import refused, typed_errors
from agentrun.posting import Poster, Timeouts

#: aiohttp's default ClientTimeout as kubernetes_asyncio leaves it (total 300 s, connect 30 s).
TIMEOUTS = Timeouts(pool=None, connect=30.0, read=300.0)
#: aiohttp's keep-alive for idle connections.
KEEPALIVE_SECONDS = 15.0


class LeanWrites:
    def __init__(self, api: client.ApiClient) -> None:
        configuration = api.configuration
        server = URL(str(configuration.host))
        self._api = api
        self._prefix = server.raw_path.rstrip("/")
        self._poster = Poster(
            server.origin(),
            tls=tls_context(configuration) if server.scheme == "https" else None,
            server_hostname=configuration.tls_server_name,
            limit=configuration.connection_pool_maxsize,
            keepalive=KEEPALIVE_SECONDS,
            timeouts=TIMEOUTS,
        )

    @classmethod
    def of(cls, api: client.ApiClient) -> LeanWrites | None:
        return None if api.configuration.proxy else cls(api)

    async def send(self, method: str, path: str, body: dict[str, Any], content_type: str) -> bytes:
        """The answer's body; a refusal or a failed connection raised as its typed APIError."""
        headers = {
            **self._api.default_headers,
            "Accept": "application/json",
            "Content-Type": content_type,
            "Accept-Encoding": "gzip, deflate",  # as aiohttp asks
        }
        await self._api.update_params_for_auth(headers, [], ["BearerToken"])
        with typed_errors():  # TimeoutError, refused, reset, an answer cut short, TLS: APITransportError
            answer = await self._poster.send(method, self._prefix + path, headers, json_text.encode(body))
        if not 200 <= answer.status <= 299:
            raise refused(answer.status, answer.reason, answer.body, CIMultiDict(answer.headers))
        return answer.body

    async def close(self) -> None:
        await self._poster.close()


def tls_context(configuration: client.Configuration) -> ssl.SSLContext:
    """The context kubernetes_asyncio's REST client makes of the same configuration."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.disable_strict_ssl_verification:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context
