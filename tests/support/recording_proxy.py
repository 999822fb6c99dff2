"""A recording reverse proxy between the operator and the scenario's API server, emulated or real.

Some scenarios assert on what the operator *sent*: how many writes an iteration costs, or that nothing
wrote to a run after it was deleted. Writes that change nothing or fail (a status patch answered 404)
show in no watch stream; the emulator's request log has them, but only the emulator has one. The proxy
sees every request of the operator it fronts, whichever server is behind it, so one assertion holds
on both backends with the same strength.

The operator gets a kubeconfig pointing at the proxy (plain HTTP on 127.0.0.1, a placeholder token);
the proxy forwards each request with the cluster's own credentials and streams answers back as they
arrive (watches included). Each request is recorded when it arrives, before it is forwarded.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from yarl import URL

from agentrun_sandbox.kube.http import parse_path, rbac_verb
from tests.support.clusters import TestCluster
from tests.support.ports import free_port

#: Hop-by-hop headers, and those the proxy replaces (credentials, framing). Answers are streamed through
#: unchanged, compression included: the client's Accept-Encoding goes upstream, Content-Encoding back.
_REQUEST_DROPPED = frozenset({"host", "authorization", "content-length", "transfer-encoding", "connection"})
_RESPONSE_DROPPED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})
PLACEHOLDER_TOKEN = "recording-proxy"  # the proxy authenticates upstream; this only satisfies clients


@dataclass
class Call:
    """One request as the operator sent it; ``status`` is set once the server answered."""

    method: str
    path: str
    query: Mapping[str, str]
    verb: str
    resource: str | None
    subresource: str | None
    namespace: str | None
    name: str | None
    status: int | None = None


class RecordingProxy:
    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster
        self.calls: list[Call] = []
        self.port = free_port()
        self.kubeconfig = cluster.workdir / f"recording-proxy-{self.port}.kubeconfig"
        self._runner: web.AppRunner | None = None
        self._upstream: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def request(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """A request of the test's own through the proxy: recorded in order with the operator's."""
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {PLACEHOLDER_TOKEN}"}) as session,
            session.request(method, f"{self.url}{path}", **kwargs) as response,
        ):
            text = await response.text()
            return response.status, json.loads(text) if text else None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self.cluster.credentials.ssl_context)
        # Watches stay open for minutes with nothing to read: no total or read timeout.
        timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=None)
        self._upstream = aiohttp.ClientSession(
            headers=self.cluster.credentials.headers,
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # A client that goes away (SIGKILL) cancels its handlers, and with them their upstream watches.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=2.0, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self.kubeconfig.write_text(yaml.safe_dump(self._kubeconfig()))

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._upstream is not None:
            await self._upstream.close()
            self._upstream = None

    def _kubeconfig(self) -> dict[str, object]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
            "users": [{"name": "proxy", "user": {"token": PLACEHOLDER_TOKEN}}],
            "contexts": [
                {
                    "name": "proxy",
                    "context": {"cluster": "proxy", "user": "proxy", "namespace": self.cluster.namespace},
                }
            ],
            "current-context": "proxy",
        }

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._upstream is not None
        route = parse_path(request.path)
        query = dict(request.query)
        call = Call(
            method=request.method,
            path=request.path,
            query=query,
            verb=rbac_verb(request.method, route, query),
            resource=route.plural,
            subresource=route.subresource,
            namespace=route.namespace,
            name=route.name,
        )
        self.calls.append(call)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _REQUEST_DROPPED]
        if "Accept-Encoding" not in request.headers:
            headers.append(("Accept-Encoding", "identity"))  # else aiohttp would ask for gzip on its behalf
        body = await request.read()
        url = URL(self.cluster.url + request.raw_path, encoded=True)
        async with self._upstream.request(
            request.method, url, headers=headers, data=body or None, allow_redirects=False
        ) as upstream:
            call.status = upstream.status
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _RESPONSE_DROPPED:
                    response.headers.add(key, value)
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError):  # the client went away mid-stream
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            return response


@contextlib.asynccontextmanager
async def recording_proxy(cluster: TestCluster) -> AsyncIterator[RecordingProxy]:
    proxy = RecordingProxy(cluster)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
