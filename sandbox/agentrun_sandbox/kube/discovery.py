"""What the server says about itself: /version, health, discovery, OpenAPI v3 and the root paths."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs

from agentrun_sandbox.kube import openapi
from agentrun_sandbox.kube.access import EmulatorAccess
from agentrun_sandbox.kube.basics import Reply, version_priority
from agentrun_sandbox.kube.http import ApiError, ApiRoute, RequestRecord


@attrs.define(kw_only=True)
class EmulatorDiscovery(EmulatorAccess):
    """Answers about the API rather than about objects."""

    server_version: str = "v1.33.0"
    #: Where clients reach this server (``serverAddressByClientCIDRs``); the runner sets it once bound.
    server_address: str = attrs.field(default="127.0.0.1:0", init=False)

    def _serve_other(self, route: ApiRoute, record: RequestRecord) -> Reply:
        path = record.path.rstrip("/") or "/"
        if path == "/version" and record.method == "GET":
            major, minor = re.findall(r"\d+", self.server_version)[:2]
            return Reply(
                200,
                {
                    "major": major,
                    "minor": minor,
                    "gitVersion": self.server_version,
                    "gitCommit": "kube-emulator",
                    "gitTreeState": "clean",
                    "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.24",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        if path in ("/healthz", "/livez", "/readyz"):
            return Reply(200, text="ok")
        if path == "/openapi/v3":
            return Reply(200, openapi.index(t for t in self._types.values() if t.served))
        if path.startswith("/openapi/v3/"):
            doc_path = path.removeprefix("/openapi/v3/")
            members = [t for t in self._types.values() if t.served and openapi.doc_path(t) == doc_path]
            if members:
                return Reply(200, openapi.document(members))
        if path == "/":
            paths = {"/api", "/api/v1", "/apis", "/version", "/healthz", "/livez", "/readyz"}
            paths |= {f"/apis/{t.group}" for t in self._types.values() if t.group}
            paths |= {f"/apis/{t.group_version}" for t in self._types.values() if t.group}
            return Reply(200, {"paths": sorted(paths)})
        raise ApiError.no_route()

    # ----------------------------------------------------------------------------------------------------
    # Discovery

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, set[str]] = {}
        for rtype in self._types.values():
            if rtype.served:
                groups.setdefault(rtype.group, set()).add(rtype.version)
        return {g: sorted(vs, key=version_priority) for g, vs in groups.items()}

    def _serve_discovery(self, route: ApiRoute) -> Reply:
        groups = self._groups()
        if route.group == "" and route.version is None:
            return Reply(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self.server_address}
                    ],
                },
            )
        if route.group is None:
            return Reply(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [_api_group(g, vs) for g, vs in sorted(groups.items()) if g],
                },
            )
        if route.group not in groups or (
            route.version is not None and route.version not in groups[route.group]
        ):
            raise ApiError.no_route()
        if route.version is None:
            return Reply(
                200, {"kind": "APIGroup", "apiVersion": "v1", **_api_group(route.group, groups[route.group])}
            )
        resources = [
            entry
            for rtype in sorted(self._types.values(), key=lambda t: t.plural)
            if rtype.group == route.group and rtype.version == route.version and rtype.served
            for entry in rtype.discovery()
        ]
        group_version = f"{route.group}/{route.version}" if route.group else route.version
        return Reply(
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            },
        )


def _api_group(group: str, versions: Sequence[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}
