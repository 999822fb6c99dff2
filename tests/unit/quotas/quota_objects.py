"""AgentRunQuota objects as the API server hands them out, and instants to build fake times from."""

from __future__ import annotations

import datetime as dt
from typing import Any

from agentrun.quotas.ledger import QuotaDefinition


def at(text: str) -> dt.datetime:
    """An instant written as in a status: "2026-11-24T09:15:00Z"."""
    return dt.datetime.fromisoformat(text)


def quota_object(
    *,
    name: str = "team",
    namespace: str = "research",
    window: str | None = "Day",
    hard: dict[str, Any] | None = None,
    per_run: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard or {}}
    if window is not None:
        spec["window"] = window
    if per_run is not None:
        spec["perRun"] = per_run
    obj: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRunQuota",
        "metadata": {"name": name, "namespace": namespace, "generation": 1, "uid": f"uid-{name}"},
        "spec": spec,
    }
    if status is not None:
        obj["status"] = status
    return obj


def definition(**kwargs: Any) -> QuotaDefinition:
    return QuotaDefinition.from_object(quota_object(**kwargs))
