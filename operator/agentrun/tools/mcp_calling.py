"""MCP servers over streamable HTTP: listed once at run start, then called for the whole run.

The `mcp` client runs on anyio task groups, which must be entered and left by the same task.
Tool calls run in the dispatcher's tasks, so each connection is owned by a task of its own that
holds it open until the tool set closes; a broken connection is reopened on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx2
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput

MAX_LIST_PAGES = 50


def describe(exc: BaseException) -> str:
    """A one-line reason, unwrapping the exception groups anyio wraps transport errors in."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class MCPSession:
    def __init__(self, url: str, headers: Mapping[str, str], *, timeout_seconds: float = 30.0) -> None:
        self.url = url
        self._headers = dict(headers)
        self._timeout = timeout_seconds
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    async def connected(self) -> Client:
        async with self._lock:
            if self._client is not None and self._owner is not None and not self._owner.done():
                return self._client
            await self._shutdown()
            ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._owner = asyncio.create_task(self._own(ready, self._stop), name=f"mcp {self.url}")
            self._client = await ready
            return self._client

    async def _own(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        try:
            timeout = httpx2.Timeout(self._timeout, read=300.0)
            async with (
                httpx2.AsyncClient(headers=self._headers, timeout=timeout) as http,
                Client(streamable_http_client(self.url, http_client=http)) as client,
            ):
                ready.set_result(client)
                await stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(ConnectionError(describe(exc)))

    async def broken(self) -> None:
        """Forget the connection after a transport failure; the next call reconnects."""
        async with self._lock:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._client = None
        owner, self._owner = self._owner, None
        if owner is not None:
            self._stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(owner), timeout=5)
            if not owner.done():
                owner.cancel()
                with contextlib.suppress(BaseException):
                    await owner

    async def list_tools(self) -> list[mcp_types.Tool]:
        client = await self.connected()
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise ConnectionError(f"tools/list did not end after {MAX_LIST_PAGES} pages")

    async def close(self) -> None:
        async with self._lock:
            await self._shutdown()


def render(result: mcp_types.CallToolResult) -> str:
    """The result's content as text for the model; binary parts are named, not inlined."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            parts.append(f"[{block.type} content, {block.mime_type}, not shown]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link: {block.uri}]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[binary resource {resource.uri}, not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


class MCPTool:
    """One tool of an MCP server, under its prefixed name."""

    def __init__(self, session: MCPSession, *, remote_name: str, definition: ToolDefinition) -> None:
        self._session = session
        self._remote = remote_name
        self.definition = definition

    async def call(self, call: ToolCall) -> ToolOutput:
        try:
            client = await self._session.connected()
        except ConnectionError as exc:
            raise ToolError(
                "unavailable", f"MCP server {self._session.url} is unreachable ({exc})", hint="try later"
            ) from None
        arguments: dict[str, Any] = dict(call.input)
        try:
            result = await client.call_tool(self._remote, arguments)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise ToolError("mcp_error", f"{self.definition.name}: {exc.error.message}") from None
            await self._session.broken()
            raise ToolError(
                "unavailable",
                f"{self.definition.name}: the connection to the MCP server closed ({exc.error.message})",
                hint="the call may not have run; try again",
            ) from None
        except Exception as exc:
            await self._session.broken()
            raise ToolError(
                "unavailable",
                f"{self.definition.name}: connection to the MCP server failed ({describe(exc)})",
                hint="the call may not have run; try again",
            ) from None
        text = render(result)
        if result.is_error:
            raise ToolError("tool_error", text or f"{self.definition.name} failed", hint="")
        return ToolOutput(text)
