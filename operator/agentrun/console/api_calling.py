"""The API server as one person sees it: each request carries that person's identity (identities.py).

Plain aiohttp rather than the operator's Kubernetes client: a request as an impersonated person needs
one ``Impersonate-Group`` header per group, which the generated client's header dict cannot hold, and
the console's own credentials must not go out with a person's token (a client certificate would win over
the token on the server, and the person would act as the console).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import aiohttp
from multidict import CIMultiDict

from agentrun import __version__
from agentrun.console.identities import Identity
from agentrun.kube.errors import APIError, refused, translated
from agentrun.kube.kubeconfig_loading import ClusterAccess

USER_AGENT = f"agentrun-console/{__version__}"
#: A watch event of a large object (etcd allows 1.5 MiB), as the operator's client reads them.
READ_BUFFER = 2**21
#: A token read from a rotating file is read again at most this often; an expiring one this long before.
RENEW_SECONDS = 60.0


@contextlib.contextmanager
def translating() -> Iterator[None]:
    """aiohttp's and the socket's failures as the typed API errors (kube/errors.py), once for all calls."""
    try:
        yield
    except APIError:
        raise
    except Exception as exc:
        error = translated(exc)
        if error is None:
            raise
        raise error from exc


def tls_context(access: ClusterAccess, *, client_certificate: bool) -> ssl.SSLContext | bool:
    if not access.server.startswith("https:"):
        return False
    context = ssl.create_default_context(cafile=access.ca_path)
    if access.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_certificate and access.certificate_path and access.private_key_path:
        context.load_cert_chain(access.certificate_path, access.private_key_path)
    return context


class ClusterAPI:
    """``own_credentials``: whether the console's own credentials may go out at all (not in token mode,
    where only people's tokens do)."""

    def __init__(self, access: ClusterAccess, *, own_credentials: bool) -> None:
        self._access = access
        self._own = own_credentials
        self._renewed = time.monotonic()
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            ssl_context = tls_context(self._access, client_certificate=self._own)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_context),
                trust_env=False,
                read_bufsize=READ_BUFFER,
                proxy=self._access.proxy,
            )
        return self._session

    async def _headers(self, identity: Identity, content_type: str | None) -> CIMultiDict[str]:
        access = self._access
        due = access.expiration is not None and access.expiration.timestamp() - time.time() < RENEW_SECONDS
        if self._own and (due or (access.rotating and time.monotonic() - self._renewed > RENEW_SECONDS)):
            self._access = access = await access.renewed()
            self._renewed = time.monotonic()
        own = access.authorization if self._own else None
        headers = CIMultiDict(identity.headers(own))
        headers["Accept"] = "application/json"
        headers["User-Agent"] = USER_AGENT
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        identity: Identity,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """The decoded answer; an answer outside 2xx raises the typed APIStatusError (kube/errors.py)."""
        data = None if body is None else json.dumps(body).encode()
        headers = await self._headers(identity, content_type if data is not None else None)
        with translating():
            async with self._http().request(
                method, self._access.server + path, params=params, data=data, headers=headers
            ) as response:
                raw = await response.read()
                if response.status >= 300:
                    raise refused(response.status, response.reason, raw, response.headers)
        answer: dict[str, Any] = json.loads(raw) if raw else {}
        return answer

    async def watch(
        self, identity: Identity, path: str, params: Mapping[str, str]
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events of one request, until the server ends it (``ERROR`` events are yielded)."""
        headers = await self._headers(identity, None)
        query = {**params, "watch": "true", "allowWatchBookmarks": "true"}
        with translating():
            async with self._http().get(
                self._access.server + path,
                params=query,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            ) as response:
                if response.status >= 300:
                    raise refused(response.status, response.reason, await response.read(), response.headers)
                async for line in response.content:
                    if line.strip():
                        yield json.loads(line)
