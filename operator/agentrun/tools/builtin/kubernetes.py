"""Read-only Kubernetes tools acting as the run's ServiceAccount.

Namespaces: the run's own, plus those listed in the tool's `config.namespaces`; RBAC still decides
inside them. Cluster-scoped resources only with `config.clusterScoped: true`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import Tool, ToolCall, ToolDefinition, ToolOutput
from agentrun.tools.builtin.kube_output import event_line, stripped, summary
from agentrun.tools.kube_reading import EVENT, POD, KubeReader, ResourceInfo

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
DEFAULT_TAIL = 200
MAX_TAIL = 5000
LOG_BYTES = 200_000


@dataclass(frozen=True)
class Scope:
    home: str
    extra: tuple[str, ...]
    cluster_scoped: bool

    @classmethod
    def parse(cls, config: Mapping[str, Any], home: str, *, cluster_scoped_key: bool) -> Scope:
        known = {"namespaces", "clusterScoped"} if cluster_scoped_key else {"namespaces"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown keys {unknown} (known: {sorted(known)})")
        extra = config.get("namespaces", [])
        if not isinstance(extra, list) or not all(isinstance(n, str) and n for n in extra):
            raise ValueError("namespaces must be a list of namespace names")
        if "*" in extra:
            raise ValueError("namespaces must name each namespace; '*' is not allowed")
        flag = config.get("clusterScoped", False)
        if not isinstance(flag, bool):
            raise ValueError("clusterScoped must be true or false")
        return cls(home, tuple(extra), flag)

    def namespace(self, value: Any) -> str:
        if value is None or value == "":
            return self.home
        if not isinstance(value, str):
            raise ToolError("invalid_input", "namespace must be a string")
        if value != self.home and value not in self.extra:
            allowed = ", ".join((self.home, *self.extra))
            raise ToolError(
                "namespace_not_allowed",
                f"namespace {value!r} is not open to this tool",
                hint=f"namespaces this tool may read: {allowed}",
            )
        return value

    def description(self) -> str:
        names = ", ".join((self.home, *self.extra))
        return f"Namespaces: {names} (default {self.home})."


def _text(value: Any, field: str, *, required: bool = False) -> str | None:
    if value is None or value == "":
        if required:
            raise ToolError("invalid_input", f"{field} is required")
        return None
    if not isinstance(value, str):
        raise ToolError("invalid_input", f"{field} must be a string")
    return value


def _int(value: Any, field: str, default: int, maximum: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise ToolError("invalid_input", f"{field} must be an integer between 1 and {maximum}")
    return value


class _KubeTool:
    definition: ToolDefinition

    def __init__(self, reader: KubeReader, scope: Scope) -> None:
        self._reader = reader
        self._scope = scope

    async def _target(self, call: ToolCall) -> tuple[ResourceInfo, str | None]:
        resource = _text(call.input.get("resource"), "resource", required=True)
        assert resource is not None
        info = await self._reader.resolve(resource)
        if not info.namespaced:
            if not self._scope.cluster_scoped:
                raise ToolError(
                    "cluster_scoped_not_allowed",
                    f"{info.display} is cluster-scoped and this tool reads namespaced resources only",
                )
            return info, None
        return info, self._scope.namespace(call.input.get("namespace"))


_RESOURCE = {
    "type": "string",
    "description": "Resource as kubectl names it: pods, deployments.apps, configmaps, cronjobs.batch, ...",
}
_NAMESPACE = {"type": "string", "description": "Namespace; defaults to the run's own."}


class KubernetesGet(_KubeTool):
    def __init__(self, reader: KubeReader, scope: Scope) -> None:
        super().__init__(reader, scope)
        self.definition = ToolDefinition(
            name="kubernetes_get",
            description=(
                "Reads one Kubernetes object (managedFields and last-applied annotations removed). "
                + scope.description()
            ),
            input_schema={
                "type": "object",
                "properties": {"resource": _RESOURCE, "name": {"type": "string"}, "namespace": _NAMESPACE},
                "required": ["resource", "name"],
                "additionalProperties": False,
            },
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        info, namespace = await self._target(call)
        name = _text(call.input.get("name"), "name", required=True)
        where = f" in namespace {namespace}" if namespace else ""
        obj = await self._reader.get_json(
            info.path(namespace, name), action=f"get {info.display} {name}{where}"
        )
        return ToolOutput(json.dumps(stripped(obj), separators=(",", ":")))


class KubernetesList(_KubeTool):
    def __init__(self, reader: KubeReader, scope: Scope) -> None:
        super().__init__(reader, scope)
        self.definition = ToolDefinition(
            name="kubernetes_list",
            description=(
                "Lists Kubernetes objects of one resource, one compact summary per object "
                "(name, labels, status at a glance); use kubernetes_get for details. " + scope.description()
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "resource": _RESOURCE,
                    "namespace": _NAMESPACE,
                    "labelSelector": {"type": "string", "description": "e.g. app=web,tier!=db"},
                    "fieldSelector": {"type": "string", "description": "e.g. status.phase=Running"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                    "continue": {"type": "string", "description": "token from a previous answer"},
                },
                "required": ["resource"],
                "additionalProperties": False,
            },
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        info, namespace = await self._target(call)
        limit = _int(call.input.get("limit"), "limit", DEFAULT_LIMIT, MAX_LIMIT)
        query = {"limit": str(limit)}
        for key in ("labelSelector", "fieldSelector", "continue"):
            if value := _text(call.input.get(key), key):
                query[key] = value
        where = f" in namespace {namespace}" if namespace else ""
        listing = await self._reader.get_json(
            info.path(namespace), query, action=f"list {info.display}{where}"
        )
        items = [summary(item) for item in listing.get("items") or []]
        meta = listing.get("metadata") or {}
        answer: dict[str, Any] = {"resource": info.display, "count": len(items), "items": items}
        if namespace:
            answer["namespace"] = namespace
        if meta.get("continue"):
            answer["continue"] = meta["continue"]
            answer["remaining"] = meta.get("remainingItemCount", "more")
        return ToolOutput(json.dumps(answer, separators=(",", ":")))


class PodLogs(_KubeTool):
    def __init__(self, reader: KubeReader, scope: Scope) -> None:
        super().__init__(reader, scope)
        self.definition = ToolDefinition(
            name="pod_logs",
            description=f"Reads the last lines of a pod's container log. {scope.description()}",
            input_schema={
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "Pod name"},
                    "namespace": _NAMESPACE,
                    "container": {"type": "string", "description": "needed when the pod has several"},
                    "tailLines": {"type": "integer", "minimum": 1, "maximum": MAX_TAIL},
                    "previous": {"type": "boolean", "description": "the previous (crashed) instance"},
                },
                "required": ["name"],
                "additionalProperties": False,
            },
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        name = _text(call.input.get("name"), "name", required=True)
        assert name is not None
        namespace = self._scope.namespace(call.input.get("namespace"))
        tail = _int(call.input.get("tailLines"), "tailLines", DEFAULT_TAIL, MAX_TAIL)
        query = {"tailLines": str(tail), "limitBytes": str(LOG_BYTES)}
        if container := _text(call.input.get("container"), "container"):
            query["container"] = container
        previous = call.input.get("previous")
        if previous is not None and not isinstance(previous, bool):
            raise ToolError("invalid_input", "previous must be true or false")
        if previous:
            query["previous"] = "true"
        text = await self._reader.get_text(
            POD.path(namespace, name, "log"),
            query,
            action=f"read logs of pod {name} in namespace {namespace}",
        )
        return ToolOutput(text or "(the log is empty)")


class KubernetesEvents(_KubeTool):
    def __init__(self, reader: KubeReader, scope: Scope) -> None:
        super().__init__(reader, scope)
        self.definition = ToolDefinition(
            name="kubernetes_events",
            description=(
                "Lists recent events of a namespace, newest first, optionally for one object. "
                + scope.description()
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "namespace": _NAMESPACE,
                    "objectName": {"type": "string", "description": "only events about this object"},
                    "objectKind": {"type": "string", "description": "e.g. Pod, with objectName"},
                    "type": {"type": "string", "enum": ["Normal", "Warning"]},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                },
                "additionalProperties": False,
            },
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        namespace = self._scope.namespace(call.input.get("namespace"))
        limit = _int(call.input.get("limit"), "limit", DEFAULT_LIMIT, MAX_LIMIT)
        selectors = []
        if name := _text(call.input.get("objectName"), "objectName"):
            selectors.append(f"involvedObject.name={name}")
        if kind := _text(call.input.get("objectKind"), "objectKind"):
            selectors.append(f"involvedObject.kind={kind}")
        if kind_of_event := _text(call.input.get("type"), "type"):
            selectors.append(f"type={kind_of_event}")
        query = {"fieldSelector": ",".join(selectors)} if selectors else {}
        listing = await self._reader.get_json(
            EVENT.path(namespace), query, action=f"list events in namespace {namespace}"
        )
        lines = [event_line(e) for e in listing.get("items") or []]
        lines.sort(key=lambda e: str(e.get("last") or ""), reverse=True)
        answer = {"namespace": namespace, "count": len(lines), "events": lines[:limit]}
        if len(lines) > limit:
            answer["omitted"] = len(lines) - limit
        return ToolOutput(json.dumps(answer, separators=(",", ":")))


KUBERNETES_TOOLS: dict[str, Callable[[KubeReader, Scope], Tool]] = {
    "kubernetes_get": KubernetesGet,
    "kubernetes_list": KubernetesList,
    "pod_logs": PodLogs,
    "kubernetes_events": KubernetesEvents,
}
CLUSTER_SCOPED_CAPABLE = frozenset({"kubernetes_get", "kubernetes_list"})
