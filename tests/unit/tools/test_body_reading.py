"""Tools read whole answers up to their cap, however the server splits them into chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import aiohttp.web
import pytest

from agentrun.tools.body_reading import read_capped

BODY = bytes(range(256)) * 40  # 10 KiB, sent in 1 KiB chunks with pauses between them


@pytest.fixture
async def chunked_url() -> AsyncIterator[str]:
    async def chunked(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(BODY), 1024):
            await response.write(BODY[start : start + 1024])
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    app = aiohttp.web.Application()
    app.router.add_get("/", chunked)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("limit", "expected"), [(len(BODY) + 1, BODY), (len(BODY), BODY), (3000, BODY[:3000])]
)
async def test_a_body_sent_in_chunks_is_read_whole_up_to_the_cap(
    chunked_url: str, limit: int, expected: bytes
) -> None:
    async with aiohttp.ClientSession() as session, session.get(chunked_url) as response:
        assert await read_capped(response.content, limit) == expected
