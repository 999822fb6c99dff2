"""Reading the Kubernetes API as the run's ServiceAccount (impersonation), never as the operator.

The operator's transport (server, CA, credentials) carries `Impersonate-User` on every request,
so the API server authorises each read against the ServiceAccount's RBAC. API answers are
translated into tool errors here, once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from agentrun.loop.errors import ToolError
from agentrun.tools.body_reading import read_capped
from agentrun.tools.environment import KubeConnection

MAX_BODY_BYTES = 8_388_608
VERSION = re.compile(r"^v\d+((alpha|beta)\d+)?$")


def service_account_user(namespace: str, service_account: str | None) -> str:
    """The impersonated user; an unset serviceAccountName means the namespace's `default` SA."""
    return f"system:serviceaccount:{namespace}:{service_account or 'default'}"


@dataclass(frozen=True)
class ResourceInfo:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
        if sub is not None:
            base += f"/{sub}"
        return base

    @property
    def display(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


POD = ResourceInfo("", "v1", "pods", "Pod", True)
EVENT = ResourceInfo("", "v1", "events", "Event", True)


class KubeReader:
    def __init__(self, connection: KubeConnection, *, user: str) -> None:
        self.user = user
        self._connection = connection
        self._session: aiohttp.ClientSession | None = None
        self._resource_lists: dict[str, list[Mapping[str, Any]] | None] = {}
        self._groups: list[tuple[str, str]] | None = None
        self._lock = asyncio.Lock()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._connection.ssl_context or False)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=60)
            )
        return self._session

    async def _request(self, path: str, query: Mapping[str, str] | None, *, action: str) -> tuple[int, str]:
        headers = {"Accept": "application/json", **await self._connection.headers(self.user)}
        url = self._connection.url(path)
        try:
            async with self._client().get(url, params=dict(query or {}), headers=headers) as response:
                raw = await read_capped(response.content, MAX_BODY_BYTES)
                return response.status, raw.decode("utf-8", "replace")
        except TimeoutError:
            raise ToolError("timeout", f"the Kubernetes API did not answer to {action}") from None
        except aiohttp.ClientError as exc:
            raise ToolError(
                "unavailable", f"cannot reach the Kubernetes API ({type(exc).__name__})", hint="try later"
            ) from None

    def _error(self, status: int, text: str, action: str) -> ToolError:
        try:
            message = str(json.loads(text).get("message") or "")
        except (ValueError, AttributeError):
            message = text[:300]
        if status == 403 and "impersonate" in message:
            return ToolError(
                "impersonation_denied",
                f"the operator may not act as {self.user}: {message}",
                hint="the operator's RBAC needs impersonate on this ServiceAccount",
                recoverable=False,
            )
        if status == 403:
            return ToolError(
                "forbidden",
                f"not allowed: {self.user} may not {action} ({message})",
                hint="RBAC of the run's ServiceAccount forbids this; do not retry, read something else",
            )
        if status == 401:
            return ToolError(
                "unauthorized", "the operator's Kubernetes credentials were rejected", recoverable=False
            )
        if status == 404:
            # Say what was asked: a pod's log answers 404 naming its node (`pods "node-1" not found`)
            # when that node is gone, which alone reads as if the pod were missing.
            said = f"{action} ({message})" if message else action
            return ToolError("not_found", f"not found: {said}", hint="check the name and namespace")
        if status in (400, 422):
            return ToolError("bad_request", f"the API rejected the request: {message}", hint="fix the input")
        return ToolError(
            "unavailable", f"the Kubernetes API answered HTTP {status} to {action}", hint="try later"
        )

    async def get_json(self, path: str, query: Mapping[str, str] | None = None, *, action: str) -> Any:
        status, text = await self._request(path, query, action=action)
        if status != 200:
            raise self._error(status, text, action)
        try:
            return json.loads(text)
        except ValueError:
            raise ToolError("unavailable", f"the Kubernetes API answered non-JSON to {action}") from None

    async def get_text(self, path: str, query: Mapping[str, str] | None = None, *, action: str) -> str:
        status, text = await self._request(path, query, action=action)
        if status != 200:
            raise self._error(status, text, action)
        return text

    async def resolve(self, resource: str) -> ResourceInfo:
        """kubectl-style names: plural, singular, kind or short name, optionally `.version.group`."""
        name, _, rest = resource.strip().partition(".")
        version: str | None = None
        group: str | None = None
        if rest:
            first, _, remainder = rest.partition(".")
            if VERSION.match(first) and remainder:
                version, group = first, remainder
            else:
                group = rest
        async with self._lock:
            for gv in await self._candidates(group, version):
                resources = await self._resources(gv)
                for entry in resources or ():
                    if "/" in str(entry.get("name", "")):
                        continue
                    names = {
                        entry.get("name"),
                        entry.get("singularName"),
                        str(entry.get("kind", "")).lower(),
                        *(entry.get("shortNames") or ()),
                    }
                    if name.lower() in names or name in names:
                        g, _, v = gv.rpartition("/")
                        return ResourceInfo(
                            g,
                            v,
                            str(entry["name"]),
                            str(entry.get("kind", "")),
                            bool(entry.get("namespaced")),
                        )
        raise ToolError(
            "unknown_resource",
            f"the API server serves no resource {resource!r}",
            hint="use a plural resource name such as pods, deployments.apps or configmaps",
        )

    async def _candidates(self, group: str | None, version: str | None) -> list[str]:
        if group in ("", "core") or (group is None and version == "v1"):
            return ["v1"]
        if group is not None and version is not None:
            return [f"{group}/{version}"]
        if self._groups is None:
            listing = await self.get_json("/apis", action="discover API groups")
            self._groups = [
                (str(g["name"]), str(g["preferredVersion"]["groupVersion"]))
                for g in listing.get("groups", [])
                if g.get("preferredVersion")
            ]
        if group is not None:
            return [gv for g, gv in self._groups if g == group]
        return ["v1", *(gv for _, gv in self._groups)]

    async def _resources(self, group_version: str) -> list[Mapping[str, Any]] | None:
        if group_version not in self._resource_lists:
            path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
            try:
                listing = await self.get_json(path, action=f"discover {group_version}")
            except ToolError as exc:
                if exc.code in ("not_found", "forbidden"):
                    self._resource_lists[group_version] = None
                    return None
                raise
            self._resource_lists[group_version] = list(listing.get("resources", []))
        return self._resource_lists[group_version]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
