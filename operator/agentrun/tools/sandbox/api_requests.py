"""Plain requests to the API server for the sandbox: its pods, its NetworkPolicy, the run's idle mark.

Why not the kubernetes client: a request here is made as the run's ServiceAccount (impersonation) or
as the operator, chosen per request, over one session, and its answer is the status and the decoded
body the caller switches on (a 404 or a 409 is an answer, not an exception).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from agentrun.loop.errors import ToolError
from agentrun.tools.environment import KubeConnection

__all__ = ["ApiRequests"]


class ApiRequests:
    """Plain requests to the API server over the operator's transport, as ``user`` when given."""

    def __init__(self, connection: KubeConnection) -> None:
        self._connection = connection
        self._session: aiohttp.ClientSession | None = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        user: str | None,
        body: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> tuple[int, dict[str, Any]]:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._connection.ssl_context or False)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=60)
            )
        headers = {"Accept": "application/json", **await self._connection.headers(user)}
        if content_type is not None:
            headers["Content-Type"] = content_type
        url = self._connection.url(path)
        try:
            async with self._session.request(method, url, json=body, headers=headers) as response:
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ToolError(
                "unavailable", f"cannot reach the Kubernetes API ({type(exc).__name__})"
            ) from None
        try:
            decoded = json.loads(text) if text else {}
        except ValueError:
            decoded = {"message": text[:300]}
        return response.status, decoded if isinstance(decoded, dict) else {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
