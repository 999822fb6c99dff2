"""The Kubernetes reader takes whole answers, however the server splits them into chunks.

A real kube-apiserver streams larger answers (``/api/v1`` discovery) in several chunks; reading
only what had arrived first made the tools report "non-JSON" now and then.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp.web

from agentrun.tools.environment import KubeConnection
from agentrun.tools.kube_reading import KubeReader


async def _none() -> str | None:
    return None


async def test_an_answer_that_arrives_in_several_chunks_is_read_whole() -> None:
    listing = {
        "kind": "APIResourceList",
        "resources": [{"name": f"r{i}", "namespaced": True} for i in range(200)],
    }
    body = json.dumps(listing).encode()

    async def chunked(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(body), 1000):
            await response.write(body[start : start + 1000])
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    app = aiohttp.web.Application()
    app.router.add_get("/api/v1", chunked)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    reader = KubeReader(
        KubeConnection(f"http://{host}:{port}", None, _none), user="system:serviceaccount:a:b"
    )
    try:
        assert await reader.get_json("/api/v1", action="discover v1") == listing
    finally:
        await reader.close()
        await runner.cleanup()
