"""The operator benchmark against a real kube-apiserver: a throwaway namespace and a recording proxy.

The operator talks to the server through a TLS-terminating proxy in the benchmark process, which writes
down every request the operator sends (and when a run's status turns terminal, as the emulator does).
That count is exact: the server's own ``apiserver_request_total`` has no label naming the client, and on
a shared server the controller-manager and other tenants write at the same time, so its deltas minus an
idle rate would only estimate the operator's share. The operator still pays for TLS (to the proxy); the
proxy adds a loopback hop to each request, which the benchmark process pays for.

Several operator processes (the replica benchmark) share one proxy and are told apart by credential: each
gets a kubeconfig of its own whose bearer token names it. The proxy reads that token as the request's
client before it drops it and forwards the request with the benchmark's admin credentials, so the server
sees one identity and the benchmark still knows which replica sent what. A token rather than, say, a user
agent because it needs nothing from the operator (every Kubernetes client sends its kubeconfig's token),
and because the emulator mode tells the replicas apart by token already.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from agentrun.api.status import FINISHED_PHASES
from agentrun_sandbox.operator_process import free_port
from bench.apiserver_writes import _session_parts
from bench.cluster import BENCH_USER_AGENT, WRITE_METHODS

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "crds"
RUNS_API = "/apis/agentrun.dev/v1alpha1"
#: The API group path of each namespaced resource the benchmarks list or create.
APIS = {
    "agentruns": RUNS_API,
    "agentrunquotas": RUNS_API,
    "secrets": "/api/v1",
    "events": "/api/v1",
    "leases": "/apis/coordination.k8s.io/v1",
}
#: Headers that belong to one connection, never forwarded (RFC 9110 §7.6.1), plus the client's own
#: credentials (the proxy authenticates upstream with the kubeconfig's) and lengths aiohttp recomputes.
_NOT_FORWARDED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "content-length",
    }
)

#: A throwaway certificate for the proxy, valid for 127.0.0.1 (the operator verifies it as its CA).
_SELF_SIGNED = (
    "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
)  # fmt: skip


@dataclass(frozen=True)
class ProxiedRequest:
    at: float
    """``time.time()`` when the proxy read the request."""
    method: str
    path: str
    watch: bool
    size: int
    client: str | None = None
    """The ``Authorization`` header the client sent (its own token, dropped before forwarding)."""
    status: int | None = None
    """The server's answer; None until (or unless) it came."""

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    @property
    def kind(self) -> str:
        return request_kind(self.method, self.path, watch=self.watch)


def request_kind(method: str, path: str, *, watch: bool = False) -> str:
    """The emulator's breakdown label for a Kubernetes API path, e.g. ``PATCH agentruns/status``.

    ``/api/v1/namespaces/ns/secrets`` and ``/apis/g/v/namespaces/ns/agentruns/x/status`` name a resource
    (and subresource) after the optional namespace; a namespace object itself is ``namespaces``.
    """
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        rest = parts[3:]
    else:
        return f"{method} {path}"
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    if method == "GET" and watch:
        return f"WATCH {resource}"
    if method == "GET" and not named:
        return f"LIST {resource}"
    return f"{method} {resource}"


def run_written(method: str, path: str) -> str | None:
    """The AgentRun a write request changes (itself or a subresource), named by its path."""
    parts = [p for p in path.split("/") if p]
    if method not in WRITE_METHODS or len(parts) < 7 or parts[:2] != ["apis", "agentrun.dev"]:
        return None
    return parts[6] if parts[3] == "namespaces" and parts[5] == "agentruns" else None


def finished_run(method: str, path: str, body: bytes) -> str | None:
    """The run whose status this request turns terminal, if it does (what the emulator watches for)."""
    parts = [p for p in path.split("/") if p]
    if method != "PATCH" or len(parts) != 8 or parts[5] != "agentruns" or parts[7] != "status":
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    status = data.get("status") if isinstance(data, Mapping) else None
    if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
        return parts[6]
    return None


@dataclass
class RecordingProxy:
    """TLS on 127.0.0.1 in front of the real server; records each request, streams each response."""

    upstream: str
    upstream_tls: ssl.SSLContext | None
    upstream_headers: Mapping[str, str]
    workdir: Path
    port: int = field(default_factory=free_port)
    requests: list[ProxiedRequest] = field(default_factory=list)
    finished_at: dict[str, float] = field(default_factory=dict)
    finished_by: dict[str, str | None] = field(default_factory=dict)
    """Run → the client whose status patch turned it terminal."""
    write_latencies: list[float] = field(default_factory=list)
    """Seconds from each write reaching the proxy to the server's response headers."""
    _session: aiohttp.ClientSession | None = None
    _handlers: set[asyncio.Task[Any]] = field(default_factory=set)
    """Requests being forwarded: ended at shutdown, so none is left waiting on a closed upstream."""

    @property
    def cert_path(self) -> Path:
        return self.workdir / "proxy.crt"

    def kubeconfig(self, namespace: str, token: str = "dropped-by-the-proxy") -> Path:
        """A kubeconfig for the operator: this proxy, its certificate as the CA, a token that names the
        client in :attr:`ProxiedRequest.client` and goes no further."""
        ca = base64.b64encode(self.cert_path.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "proxy",
                    "cluster": {
                        "server": f"https://127.0.0.1:{self.port}",
                        "certificate-authority-data": ca,
                    },
                }
            ],
            "users": [{"name": "bench", "user": {"token": token}}],
            "contexts": [
                {"name": "proxy", "context": {"cluster": "proxy", "user": "bench", "namespace": namespace}}
            ],
            "current-context": "proxy",
        }
        suffix = hashlib.sha256(token.encode()).hexdigest()[:8]
        path = self.workdir / f"proxy-{self.port}-{suffix}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RecordingProxy]:
        key = self.workdir / "proxy.key"
        await _command(
            *_SELF_SIGNED, "-keyout", str(key), "-out", str(self.cert_path),
            failure="openssl could not make the proxy's certificate",
        )  # fmt: skip
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(self.cert_path, key)
        connector = aiohttp.TCPConnector(ssl=self.upstream_tls or False, limit=0)
        self._session = aiohttp.ClientSession(
            self.upstream,
            connector=connector,
            headers=dict(self.upstream_headers),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=tls).start()
        try:
            yield self
        finally:
            # The watches of stopped (or killed) operators are still streaming: end every forwarding
            # handler first, or it waits forever on its closed upstream and is garbage-collected pending.
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._session.close()
            await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if (task := asyncio.current_task()) is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        body = await request.read()
        now = time.time()
        watch = request.query.get("watch") in ("true", "1")
        # Counted on arrival: a request the operator gives up on (its Event posts time out after 5 s)
        # still reaches the server, which still writes it.
        client = request.headers.get("Authorization")
        index = len(self.requests)
        recorded = ProxiedRequest(now, request.method, request.path, watch, len(body), client)
        self.requests.append(recorded)
        if (name := finished_run(request.method, request.path, body)) is not None:
            self.finished_at.setdefault(name, now)
            self.finished_by.setdefault(name, client)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        async with self._session.request(
            request.method, request.rel_url, data=body or None, headers=headers
        ) as upstream:
            self.requests[index] = dataclasses.replace(recorded, status=upstream.status)
            if recorded.is_write:
                self.write_latencies.append(time.time() - now)
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_FORWARDED},
            )
            # The operator closes its watches when it stops, and the proxy's own shutdown ends them
            # upstream: nothing is left to forward either way.
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            return response


async def _command(*args: str, failure: str) -> None:
    """Runs a setup command; its output matters only when it fails, as the reason."""
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{failure}: {out.decode().strip()}")


@contextlib.asynccontextmanager
async def prepared(
    kubeconfig: Path, workdir: Path, namespace: str
) -> AsyncIterator[tuple[RealServer, str, RecordingProxy]]:
    """What every real-server benchmark starts from: connected, the CRDs applied, a fresh namespace
    (deleted afterwards) and the recording proxy running."""
    server = RealServer(kubeconfig, workdir)
    async with server.connected():
        await server.apply_crds()
        async with server.namespace(namespace) as name, server.proxy().running() as proxy:
            yield server, name, proxy


@dataclass
class RealServer:
    """The benchmark's own admin access to the server of a kubeconfig: namespaces, CRDs, runs."""

    kubeconfig: Path
    workdir: Path
    url: str = ""
    tls: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[RealServer]:
        with tempfile.TemporaryDirectory() as credentials:  # the client key stays out of the workdir
            self.url, self.tls, self.headers = _session_parts(self.kubeconfig, Path(credentials))
        connector = aiohttp.TCPConnector(ssl=self.tls or False, limit=50)
        async with aiohttp.ClientSession(
            self.url, connector=connector, headers={**self.headers, "User-Agent": BENCH_USER_AGENT}
        ) as self.session:
            yield self

    def proxy(self) -> RecordingProxy:
        return RecordingProxy(self.url, self.tls, self.headers, self.workdir)

    async def call(self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = ()) -> Any:
        assert self.session is not None
        async with self.session.request(method, path, json=body) as response:
            if response.status >= 300 and response.status not in ok:
                raise RuntimeError(f"{method} {path}: {response.status} {await response.text()}")
            return await response.json(content_type=None) if response.status < 300 else None

    async def apply_crds(self) -> None:
        await _command(
            "kubectl", "--kubeconfig", str(self.kubeconfig), "apply", "--server-side", "--force-conflicts",
            "-f", str(CRDS),
            failure=f"kubectl apply -f {CRDS} failed",
        )  # fmt: skip

    @contextlib.asynccontextmanager
    async def namespace(self, name: str) -> AsyncIterator[str]:
        """A fresh namespace where AgentRuns are served, deleted (and waited for) afterwards."""
        await self.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        try:
            deadline = time.monotonic() + 60
            while await self.call("GET", f"{RUNS_API}/namespaces/{name}/agentruns", ok=(404,)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the AgentRun CRD was not served within 60 s")
                await asyncio.sleep(0.5)
            yield name
        finally:
            await self.call("DELETE", f"/api/v1/namespaces/{name}", ok=(404,))
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if await self.call("GET", f"/api/v1/namespaces/{name}", ok=(404,)) is None:
                    break
                await asyncio.sleep(2)

    async def create_runs(self, namespace: str, manifests: list[dict[str, Any]]) -> dict[str, float]:
        """POST the manifests 50 at a time; returns name → creation time."""
        created: dict[str, float] = {}
        gate = asyncio.Semaphore(50)
        path = f"{RUNS_API}/namespaces/{namespace}/agentruns"

        async def post(manifest: dict[str, Any]) -> None:
            manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
            async with gate:
                await self.call("POST", path, manifest)
                created[manifest["metadata"]["name"]] = time.time()

        await asyncio.gather(*(post(m) for m in manifests))
        return created

    async def runs(self, namespace: str) -> list[dict[str, Any]]:
        return await self.list(namespace, "agentruns")

    async def list(self, namespace: str, resource: str) -> list[dict[str, Any]]:
        """Every object of a resource named in :data:`APIS` in the namespace."""
        listed = await self.call("GET", f"{APIS[resource]}/namespaces/{namespace}/{resource}")
        return list(listed["items"])

    async def create(self, namespace: str, resource: str, body: dict[str, Any]) -> None:
        body = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
        await self.call("POST", f"{APIS[resource]}/namespaces/{namespace}/{resource}", body)
