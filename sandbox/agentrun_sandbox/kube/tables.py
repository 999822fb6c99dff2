"""Server-side Table rendering, so ``kubectl get`` prints the CRD's printer columns against the emulator.

kubectl asks for ``application/json;as=Table;v=v1;g=meta.k8s.io``. Columns come from the version's
``additionalPrinterColumns`` (Name first, as the server adds it); built-in types get Name and Age.
JSONPath support covers what printer columns use: dotted fields, ``[N]`` indexes and
``[?(@.key=="value")]`` filters.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun_sandbox.kube.registry import ResourceType

_STEP_RE = re.compile(
    r"""\.([A-Za-z0-9_\-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_\-.]+)\s*==\s*["']([^"']*)["']\)\]"""
)


def json_path(obj: Any, path: str) -> Any:
    """Evaluate a printer-column JSONPath; ``None`` when any step is missing or unsupported."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    path = path.removeprefix("$")
    node = obj
    pos = 0
    while pos < len(path):
        match = _STEP_RE.match(path, pos)
        if match is None:
            return None
        pos = match.end()
        field, index, filter_key, filter_value = match.groups()
        if field is not None:
            node = node.get(field) if isinstance(node, Mapping) else None
        elif index is not None:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
        else:
            found = None
            for item in node if isinstance(node, list) else []:
                probe: Any = item
                for part in filter_key.split("."):
                    probe = probe.get(part) if isinstance(probe, Mapping) else None
                if probe is not None and str(probe) == filter_value:
                    found = item
                    break
            node = found
        if node is None:
            return None
    return node


def human_duration(seconds: float) -> str:
    """apimachinery's HumanDuration: ``45s``, ``5m3s``, ``3h``, ``2d4h``, ``3y``."""
    if seconds < -1:
        return "<invalid>"
    total = int(max(seconds, 0))
    if total < 120:
        return f"{total}s"
    minutes = total // 60
    if minutes < 10:
        return f"{minutes}m{total % 60}s" if total % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24
        return f"{days // 365}y{days % 365}d" if days % 365 else f"{days // 365}y"
    return f"{hours // 24 // 365}y"


def _age(timestamp: Any, now: datetime.datetime) -> str | None:
    if not isinstance(timestamp, str):
        return None
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return human_duration((now - then).total_seconds())


def _columns(rtype: ResourceType) -> list[dict[str, Any]]:
    name = {
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name of the object",
        "priority": 0,
    }
    if rtype.custom and rtype.printer_columns:
        columns = [name]
        for column in rtype.printer_columns:
            columns.append(
                {
                    "name": column.get("name", ""),
                    "type": column.get("type", "string"),
                    "format": column.get("format", ""),
                    "description": column.get("description", ""),
                    "priority": int(column.get("priority", 0)),
                    "jsonPath": column.get("jsonPath", ""),
                }
            )
        return columns
    age = {
        "name": "Age",
        "type": "date",
        "format": "",
        "description": "",
        "priority": 0,
        "jsonPath": ".metadata.creationTimestamp",
    }
    if rtype.plural == "namespaces" and not rtype.group:
        status = {
            "name": "Status",
            "type": "string",
            "format": "",
            "description": "",
            "priority": 0,
            "jsonPath": ".status.phase",
        }
        return [name, status, age]
    return [name, age]


def _cell(column: Mapping[str, Any], value: Any, now: datetime.datetime) -> Any:
    if value is None:
        return None
    if column["type"] == "date":
        return _age(value, now)
    if column["type"] in ("integer", "number", "boolean") and isinstance(value, int | float | bool):
        return value
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, separators=(",", ":"))
    return str(value)


def as_table(
    rtype: ResourceType,
    objects: Iterable[Mapping[str, Any]],
    resource_version: str,
    *,
    include_object: str = "Metadata",
) -> dict[str, Any]:
    now = datetime.datetime.now(tz=datetime.UTC)
    columns = _columns(rtype)
    rows = []
    for obj in objects:
        cells = [obj.get("metadata", {}).get("name")]
        cells += [_cell(col, json_path(obj, col["jsonPath"]), now) for col in columns[1:]]
        if include_object == "Object":
            embedded: Mapping[str, Any] | None = obj
        elif include_object == "None":
            embedded = None
        else:
            embedded = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata", {}),
            }
        rows.append({"cells": cells, "object": embedded})
    definitions = [{k: v for k, v in col.items() if k != "jsonPath"} for col in columns]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    }


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in (accept or "")


def wants_metadata(accept: str | None) -> bool:
    """``application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1``: the object's metadata only,
    as kube-apiserver answers it (a Secret's data never sent)."""
    return (
        bool(accept)
        and "as=PartialObjectMetadata" in (accept or "")
        and "as=PartialObjectMetadataList" not in (accept or "")
    )


def as_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }
