"""Real servers for tool tests, on 127.0.0.1: a recording webhook receiver and an MCP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as MCPToolError
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.support.local_servers import serving_app


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Answer:
    status: int = 200
    body: Any = field(default_factory=lambda: {"ok": True})
    delay: float = 0.0


@dataclass
class WebhookReceiver:
    """Answers POSTs from a queue of canned answers (then `default`), recording every request."""

    answers: list[Answer] = field(default_factory=list)
    default: Answer = field(default_factory=Answer)
    received: list[Received] = field(default_factory=list)
    url: str = ""

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        text = await request.text()
        try:
            body: Any = json.loads(text)
        except ValueError:
            body = text
        self.received.append(Received(request.path, dict(request.headers), body))
        answer = self.answers.pop(0) if self.answers else self.default
        if answer.delay:
            await asyncio.sleep(answer.delay)
        if isinstance(answer.body, str):
            return aiohttp.web.Response(status=answer.status, text=answer.body)
        return aiohttp.web.json_response(answer.body, status=answer.status)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[WebhookReceiver]:
        app = aiohttp.web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        async with serving_app(app) as self.url:
            yield self


def demo_mcp_server() -> MCPServer:
    server = MCPServer("inventory")

    @server.tool()
    def count_items(warehouse: str) -> int:
        """Counts the items stored in a warehouse."""
        return {"north": 17, "south": 4}.get(warehouse, 0)

    @server.tool()
    def reserve(warehouse: str, amount: int) -> str:
        """Reserves items; fails when there are not enough."""
        if amount > 10:
            raise MCPToolError(f"only 10 items can be reserved in {warehouse}, asked for {amount}")
        return f"reserved {amount} in {warehouse}"

    @server.tool()
    def delete_everything() -> str:
        """A tool no agent should get."""
        return "deleted"

    return server


class HeaderRecorder:
    """ASGI middleware keeping the headers of every request (to check headersFrom reached it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


@dataclass
class RunningMCP:
    url: str
    recorder: HeaderRecorder
    server: uvicorn.Server


@contextlib.asynccontextmanager
async def mcp_serving(server: MCPServer | None = None, port: int = 0) -> AsyncIterator[RunningMCP]:
    """The MCP server's streamable HTTP app under uvicorn, in this event loop."""
    app = (server or demo_mcp_server()).streamable_http_app(host="127.0.0.1")
    recorder = HeaderRecorder(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(recorder, log_level="warning", lifespan="on"))
    task = asyncio.create_task(uv.serve(sockets=[sock]))
    try:
        while not uv.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield RunningMCP(f"http://127.0.0.1:{bound}/mcp", recorder, uv)
    finally:
        uv.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def serving_in_chunks(path: str, body: bytes, chunk: int = 1024) -> AsyncIterator[str]:
    """A server that answers GET ``path`` with ``body`` in chunks, pausing between them (as a real API
    server streams its larger answers); yields its base URL."""

    async def chunked(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(body), chunk):
            await response.write(body[start : start + chunk])
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    app = aiohttp.web.Application()
    app.router.add_get(path, chunked)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
