"""A thin HTTP client for asserting on raw Kubernetes API answers: status codes, headers, Status bodies.

Typed clients hide exactly what emulator tests need to see (the 422 body, the Warning header, the watch
lines), so these tests speak plain HTTP to the emulator (or to any API server) with aiohttp.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from multidict import CIMultiDictProxy

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


@dataclass
class Answer:
    status: int
    body: Any
    headers: CIMultiDictProxy[str]

    @property
    def warnings(self) -> list[str]:
        return list(self.headers.getall("Warning", []))

    @property
    def rv(self) -> str:
        return str(self.body["metadata"]["resourceVersion"])


@dataclass
class WatchStream:
    """An open watch; :meth:`next` returns the next event or ``None`` when the server ends the stream."""

    response: aiohttp.ClientResponse
    ended: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)

    async def next(self, timeout: float = 5.0) -> dict[str, Any] | None:
        if self.ended:
            return None
        line = await asyncio.wait_for(self.response.content.readline(), timeout)
        if not line:
            self.ended = True
            return None
        event: dict[str, Any] = json.loads(line)
        self.received.append(event)
        return event

    async def take(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        events = []
        for _ in range(count):
            event = await self.next(timeout)
            if event is None:
                break
            events.append(event)
        return events

    async def rest(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Everything until the server closes the stream."""
        events = []
        while (event := await self.next(timeout)) is not None:
            events.append(event)
        return events


class KubeClient:
    def __init__(
        self, url: str, *, token: str | None = "kube-emulator-token", headers: Mapping[str, str] | None = None
    ) -> None:
        self.url = url
        self.headers = dict(headers or {})
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._session: aiohttp.ClientSession | None = None
        self._open: list[aiohttp.ClientResponse] = []

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(self.url, headers=self.headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for response in self._open:
            response.close()
        assert self._session is not None
        await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use `async with KubeClient(url) as client`"
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        data: bytes | str | None = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        payload = data if data is not None else (json.dumps(json_body) if json_body is not None else None)
        all_headers = (
            {"Content-Type": content_type, **(headers or {})} if payload is not None else dict(headers or {})
        )
        async with self.session.request(
            method, path, data=payload, params=params, headers=all_headers
        ) as response:
            text = await response.text()
            try:
                body: Any = json.loads(text) if text else None
            except ValueError:
                body = text
            return Answer(response.status, body, response.headers)

    async def get(self, path: str, **kwargs: Any) -> Answer:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, body: Any, **kwargs: Any) -> Answer:
        return await self.request("POST", path, json_body=body, **kwargs)

    async def put(self, path: str, body: Any, **kwargs: Any) -> Answer:
        return await self.request("PUT", path, json_body=body, **kwargs)

    async def patch(self, path: str, body: Any, patch_type: str = "merge", **kwargs: Any) -> Answer:
        content_type = PATCH_TYPES.get(patch_type, patch_type)
        if isinstance(body, str | bytes):
            return await self.request("PATCH", path, data=body, content_type=content_type, **kwargs)
        return await self.request("PATCH", path, json_body=body, content_type=content_type, **kwargs)

    async def delete(self, path: str, body: Any = None, **kwargs: Any) -> Answer:
        return await self.request("DELETE", path, json_body=body, **kwargs)

    async def watch(self, path: str, params: Mapping[str, str] | None = None, **headers: str) -> WatchStream:
        """Open ``?watch=true`` on ``path``; the stream closes with the client."""
        query = {"watch": "true", **(params or {})}
        response = await self.session.get(
            path, params=query, headers=headers, timeout=aiohttp.ClientTimeout(total=None)
        )
        self._open.append(response)
        assert response.status == 200, await response.text()
        return WatchStream(response)
