"""Serving /metrics on the operator's event loop (no extra thread, injected registry)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from agentrun.metrics.observing import Metrics


def metrics_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(metrics_app(registry), access_log=None)
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
