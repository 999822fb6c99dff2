"""The shape of a replica's Lease: what :class:`~.membership.Membership` writes and what it reads back.

Why apart from the membership: the membership decides when to renew, list and fence; this module only
says which fields of a ``coordination.k8s.io/v1`` Lease carry what (its group label, the view it
applied, the namespaces it serves), so the Lease I/O there reads as decisions, and these as plain
functions of a body.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.api import ANNOTATION_SERVES, LABEL_REPLICA_GROUP
from agentrun.api.times import micro_rfc3339

__all__ = ["APPLIED_VIEW", "GROUP_LABEL", "SeenLease", "lease_body", "seen_leases"]

GROUP_LABEL = LABEL_REPLICA_GROUP
APPLIED_VIEW = "agentrun.dev/applied-view"


@dataclass(frozen=True)
class SeenLease:
    """One Lease of the group, as this replica last listed it."""

    holder: str
    resource_version: str
    #: This replica's monotonic time when it first saw this resourceVersion.
    seen_at: float
    duration: float
    applied_view: str | None


def lease_body(
    current: dict[str, Any] | None,
    *,
    name: str,
    namespace: str,
    group: str,
    holder: str,
    serves: str,
    duration: float,
    applying: str | None,
) -> dict[str, Any]:
    """``current`` (None: a new Lease) renewed now by ``holder``, showing the view it applies (None:
    none) and the namespaces it serves; everything else in ``current`` is kept as it is."""
    now = micro_rfc3339()
    if current is None:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"acquireTime": now},
        }
    else:
        body = copy.deepcopy(current)
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        body.setdefault("kind", "Lease")
    metadata = body.setdefault("metadata", {})
    metadata.setdefault("labels", {})[GROUP_LABEL] = group
    annotations = metadata.setdefault("annotations", {}) or {}
    annotations[ANNOTATION_SERVES] = serves
    if applying is None:
        annotations.pop(APPLIED_VIEW, None)
    else:
        annotations[APPLIED_VIEW] = applying
    metadata["annotations"] = annotations
    spec = body.setdefault("spec", {})
    if spec.get("holderIdentity") != holder:
        spec["acquireTime"] = now
    spec.update(holderIdentity=holder, leaseDurationSeconds=int(duration), renewTime=now)
    return body


def seen_leases(
    items: Iterable[Mapping[str, Any]],
    before: Mapping[str, SeenLease],
    *,
    now: float,
    default_duration: float,
) -> dict[str, SeenLease]:
    """The group's Leases as listed ``now``, by name: each dated from when this replica first saw its
    resourceVersion (``before``: the last listing), never from the renewTime another machine wrote.
    A Lease being deleted, or without a holder, is no member's."""
    seen: dict[str, SeenLease] = {}
    for item in items:
        metadata = item.get("metadata") or {}
        spec = item.get("spec") or {}
        name, version, holder = (
            metadata.get("name"),
            metadata.get("resourceVersion"),
            spec.get("holderIdentity"),
        )
        if not name or not version or not holder or metadata.get("deletionTimestamp"):
            continue
        earlier = before.get(name)
        seen[name] = SeenLease(
            holder=str(holder),
            resource_version=str(version),
            seen_at=now if earlier is None or earlier.resource_version != version else earlier.seen_at,
            duration=float(spec.get("leaseDurationSeconds") or default_duration),
            applied_view=(metadata.get("annotations") or {}).get(APPLIED_VIEW),
        )
    return seen
