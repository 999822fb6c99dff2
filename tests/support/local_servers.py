"""An aiohttp application served on 127.0.0.1 for a test: its URL while the block runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serving_app(app: web.Application, *, shutdown_timeout: float = 0.5) -> AsyncIterator[str]:
    """``http://127.0.0.1:PORT`` on a free port; the server is cleaned up when the block ends."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
