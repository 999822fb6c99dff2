"""What every layer of the emulator shares: storage keys, the reply before it is HTTP, small helpers."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

StoreKey = tuple[str, str]  # (group, plural): one storage for all versions of a resource
ObjKey = tuple[str | None, str]  # (namespace, name)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass
class Reply:
    """An answer before it becomes an HTTP response."""

    status: int
    body: Any = None
    text: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes version ordering: v2 > v1 > v1beta2 > v1beta1 > v1alpha1 > anything else."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[match[2]]
    return (stage, -int(match[1]), -int(match[3] or 0), version)


def owner_uids(obj: Mapping[str, Any]) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {ref["uid"] for ref in refs if isinstance(ref, Mapping) and isinstance(ref.get("uid"), str)}


def metadata_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, val in headers.items():
        if key.lower() == lowered:
            return val
    return None


def sort_key(item: tuple[ObjKey, Any]) -> tuple[str, str]:
    return (item[0][0] or "", item[0][1])


def include_object(query: Mapping[str, str]) -> str:
    return query.get("includeObject") or "Metadata"


def dry_run(query: Mapping[str, str]) -> bool:
    return query.get("dryRun") == "All"
