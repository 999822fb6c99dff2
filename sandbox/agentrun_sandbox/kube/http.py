"""URL routing, request records and Status error bodies of the emulated Kubernetes API.

Kept apart from the emulator so the RBAC-relevant facts of a request (verb, group, resource,
subresource, namespace, name, identity headers) are computed in one obvious place that tests can read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrun_sandbox.kube.schema import FieldError, invalid_message

#: The second path segment after a namespace name that means a namespace subresource, not a resource.
NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})


def truthy(value: str | None) -> bool:
    """Go's strconv.ParseBool, which the server uses for ``watch=`` and friends."""
    return value in _TRUE


@dataclass(frozen=True)
class ApiRoute:
    """What a URL path addresses. ``kind`` is ``resource``, ``discovery`` or ``other`` (e.g. /version)."""

    kind: Literal["resource", "discovery", "other"]
    group: str | None = None
    version: str | None = None
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


def parse_path(path: str) -> ApiRoute:
    parts = [p for p in path.split("/") if p]
    if not parts or parts[0] not in ("api", "apis"):
        return ApiRoute("other")
    if parts[0] == "api":
        group = ""
        rest = parts[1:]
        if not rest:
            return ApiRoute("discovery", group="")
    else:
        if len(parts) == 1:
            return ApiRoute("discovery")
        group = parts[1]
        rest = parts[2:]
        if not rest:
            return ApiRoute("discovery", group=group)
    version, rest = rest[0], rest[1:]
    if not rest:
        return ApiRoute("discovery", group=group, version=version)
    namespace: str | None = None
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and not (len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES)
    ):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return ApiRoute("resource", group, version, plural, namespace, name, subresource)


def rbac_verb(method: str, route: ApiRoute, query: Mapping[str, str]) -> str:
    """The RBAC verb the real authorizer would check for this request."""
    method = method.upper()
    if route.kind != "resource":
        return method.lower()
    if method == "GET":
        if truthy(query.get("watch")):
            return "watch"
        return "get" if route.name is not None else "list"
    if method == "DELETE":
        return "delete" if route.name is not None else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


@dataclass
class RequestRecord:
    """One request as the server saw it; ``status`` is filled in when the answer is sent."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    group: str | None
    version: str | None
    resource: str | None
    subresource: str | None
    namespace: str | None
    name: str | None
    content_type: str | None
    impersonate_user: str | None = None
    impersonate_groups: tuple[str, ...] = ()
    authorization: str | None = None
    user_agent: str | None = None
    status: int | None = None
    route: ApiRoute = field(default_factory=lambda: ApiRoute("other"), repr=False, compare=False)

    @property
    def is_resource_request(self) -> bool:
        return self.route.kind == "resource"

    @property
    def rbac_resource(self) -> str | None:
        """``plural`` or ``plural/subresource`` as written in an RBAC rule."""
        if self.resource is None:
            return None
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    @property
    def rbac_key(self) -> tuple[str, str, str] | None:
        """``(apiGroup, resource[/subresource], verb)`` for coverage checks against a Role."""
        if self.group is None or self.rbac_resource is None:
            return None
        return (self.group, self.rbac_resource, self.verb)


def status_body(
    code: int, reason: str, message: str, details: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {k: v for k, v in (details or {}).items() if v not in (None, "", [])},
        "code": code,
    }
    if reason == "BadRequest" and not body["details"]:
        del body["details"]  # errors.NewBadRequest carries none, and the field is omitempty
    return body


class ApiError(Exception):
    """An answer with a Kubernetes Status body; raised inside the emulator, never escapes it."""

    def __init__(
        self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None, **headers: str
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})
        self.headers = dict(headers)

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)

    @classmethod
    def not_found(cls, group: str, plural: str, name: str) -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(
            404, "NotFound", f'{qualified} "{name}" not found', {"name": name, "group": group, "kind": plural}
        )

    @classmethod
    def no_route(cls) -> ApiError:
        return cls(404, "NotFound", "the server could not find the requested resource")

    @classmethod
    def already_exists(cls, group: str, plural: str, name: str) -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        return cls(
            409,
            "AlreadyExists",
            f'{qualified} "{name}" already exists',
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def conflict(cls, group: str, plural: str, name: str, why: str | None = None) -> ApiError:
        qualified = f"{plural}.{group}" if group else plural
        why = (
            why
            or "the object has been modified; please apply your changes to the latest version and try again"
        )
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
            {"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def invalid(cls, group: str, kind: str, name: str, errors: list[FieldError]) -> ApiError:
        qualified_kind = f"{kind}.{group}" if group else kind
        causes = [error.cause() for error in errors]
        return cls(
            422,
            "Invalid",
            invalid_message(qualified_kind, name, errors),
            {"name": name, "group": group, "kind": kind, "causes": causes},
        )

    @classmethod
    def method_not_allowed(cls) -> ApiError:
        return cls(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)


def decode_body(body: bytes, content_type: str | None) -> Any:
    """JSON (or YAML, which kubectl can send) request bodies; 400 on garbage like the real server."""
    if not body.strip():
        return None
    if content_type and ("protobuf" in content_type or "cbor" in content_type):
        # Typed Go clients (e.g. `kubectl create namespace`) send protobuf; decoding it needs the
        # Kubernetes protobuf schemas, which the emulator does not carry.
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the kube emulator accepts only JSON and YAML bodies, not {content_type}",
        )
    if content_type and "yaml" in content_type:
        import yaml  # only for the rare YAML bodies

        try:
            return yaml.safe_load(body)
        except yaml.YAMLError as exc:
            raise ApiError.bad_request(f"error decoding YAML: {exc}") from None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ApiError.bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
