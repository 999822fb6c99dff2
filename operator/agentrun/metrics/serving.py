"""Serving /metrics and /readyz on the operator's event loop (no extra thread, injected registry)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agentrun.metrics.definitions import Metrics


def metrics_app(registry: CollectorRegistry, ready: asyncio.Event | None = None) -> web.Application:
    """``ready``: set once the operator serves its resources. Readiness lives here, not beside Kopf's
    /healthz, because this server is up from the start: a pod waiting for its CRDs is alive (so the kubelet
    leaves it be) but not ready (so a rolling update keeps the old pod until the new one can work)."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def readyz(_: web.Request) -> web.Response:
        if ready is None or ready.is_set():
            return web.json_response({"ready": True})
        waiting = {"ready": False, "waiting": "the operator's start (its CRDs served)"}
        return web.json_response(waiting, status=503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/readyz", readyz)
    return app


async def start_metrics_server(
    registry: CollectorRegistry, host: str, port: int, *, ready: asyncio.Event | None = None
) -> web.AppRunner:
    runner = web.AppRunner(metrics_app(registry, ready), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def start_health_server(host: str, port: int) -> web.AppRunner:
    """GET /healthz before Kopf serves it (the operator waiting for its CRD is alive, not stuck)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"waiting": "the AgentRun CRD"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def keep_beating(metrics: Metrics, interval_seconds: float) -> None:
    """The heartbeat runs on the operator's event loop: a stale value means that loop is stuck."""
    while True:
        metrics.beat()
        await asyncio.sleep(interval_seconds)
