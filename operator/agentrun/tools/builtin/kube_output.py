"""Compact views of Kubernetes objects: what an agent needs, without bookkeeping that wastes tokens."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
SUMMARY_STATUS_KEYS = (
    "phase",
    "replicas",
    "readyReplicas",
    "availableReplicas",
    "updatedReplicas",
    "succeeded",
    "failed",
    "active",
    "podIP",
    "reason",
    "message",
)


def stripped(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object without managedFields and the last-applied annotation (often as big as the object)."""
    result = copy.deepcopy(dict(obj))
    metadata = result.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict):
            annotations.pop(LAST_APPLIED, None)
            if not annotations:
                metadata.pop("annotations")
    return result


def summary(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One line's worth of an object in a list: identity, labels and the status at a glance."""
    metadata = obj.get("metadata") or {}
    item: dict[str, Any] = {"name": metadata.get("name")}
    if metadata.get("namespace"):
        item["namespace"] = metadata["namespace"]
    if metadata.get("labels"):
        item["labels"] = metadata["labels"]
    if metadata.get("creationTimestamp"):
        item["created"] = metadata["creationTimestamp"]
    if metadata.get("deletionTimestamp"):
        item["deleting"] = True
    status = obj.get("status")
    if isinstance(status, Mapping):
        brief = {k: status[k] for k in SUMMARY_STATUS_KEYS if k in status}
        conditions = status.get("conditions")
        if isinstance(conditions, list):
            brief["conditions"] = {
                str(c.get("type")): str(c.get("status")) for c in conditions if isinstance(c, Mapping)
            }
        statuses = status.get("containerStatuses")
        if isinstance(statuses, list):
            brief["containers"] = [_container(c) for c in statuses if isinstance(c, Mapping)]
        if brief:
            item["status"] = brief
    return item


def _container(status: Mapping[str, Any]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "name": status.get("name"),
        "ready": status.get("ready"),
        "restarts": status.get("restartCount"),
    }
    state = status.get("state")
    if isinstance(state, Mapping) and state:
        kind, detail = next(iter(state.items()))
        item["state"] = kind
        if isinstance(detail, Mapping) and detail.get("reason"):
            item["reason"] = detail["reason"]
    return item


def event_line(event: Mapping[str, Any]) -> dict[str, Any]:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    return {
        "type": event.get("type"),
        "reason": event.get("reason"),
        "object": f"{involved.get('kind', '?')}/{involved.get('name', '?')}",
        "message": event.get("message") or event.get("note"),
        "count": event.get("count") or (event.get("series") or {}).get("count") or 1,
        "last": event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"),
    }
