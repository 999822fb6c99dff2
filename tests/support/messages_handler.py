"""An SDK client pointed at a one-route aiohttp server: for answers the fake Messages API cannot script."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import anthropic
from aiohttp import web

from tests.support.local_servers import serving_app

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """The base URL of a server whose POST /v1/messages goes to `handler`."""
    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    async with serving_app(app, shutdown_timeout=60.0) as url:
        yield url


@contextlib.asynccontextmanager
async def client_of(handler: Handler, *, api_key: str = "k") -> AsyncIterator[anthropic.AsyncAnthropic]:
    """POST /v1/messages goes to `handler`; SDK retries are off, as in the operator."""
    async with serving(handler) as url:
        client = anthropic.AsyncAnthropic(api_key=api_key, base_url=url, max_retries=0)
        try:
            yield client
        finally:
            await client.close()
