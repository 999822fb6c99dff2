"""`kubectl agentrun operators`: which operator replicas are alive and which namespaces they serve.

Why: a run in a namespace no operator serves shows nothing at all (no phase, no Events, and
`kubectl wait` times out), which looks the same as a slow operator. Every replica that runs with a
Lease (``AGENTRUN_LEASE_NAMESPACE``, as the chart runs it) publishes on it the namespaces it serves
(``agentrun.dev/serves``); this reads those Leases and says whether a namespace is served by a live one.
A replica is live while its Lease's ``renewTime`` plus ``leaseDurationSeconds`` is ahead of this
machine's clock (a display judged by wall clocks, unlike the replicas' own view of each other).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun.api import ANNOTATION_SERVES, LABEL_REPLICA_GROUP

ALL = "*"


@dataclass(frozen=True)
class Replica:
    namespace: str  # of its Lease
    group: str
    name: str
    #: The patterns it serves as published (("*",) for all); None: an operator too old to publish them.
    serves: tuple[str, ...] | None
    renewed: dt.datetime | None
    duration_seconds: int

    def live(self, now: dt.datetime) -> bool:
        return self.renewed is not None and self.renewed + dt.timedelta(seconds=self.duration_seconds) > now

    def serves_namespace(self, namespace: str) -> bool:
        return self.serves is not None and any(matches(namespace, entry) for entry in self.serves)

    def as_json(self, now: dt.datetime) -> dict[str, Any]:
        return {
            "leaseNamespace": self.namespace,
            "group": self.group,
            "replica": self.name,
            "serves": list(self.serves) if self.serves is not None else None,
            "renewTime": self.renewed.isoformat() if self.renewed is not None else None,
            "live": self.live(now),
        }


def matches(namespace: str, entry: str) -> bool:
    """Kopf's reading of one --namespace value: ``*``, a name, a glob, or a comma list of those where
    ``!pattern`` excludes (only exclusions: everything else)."""
    parts = [part.strip() for part in entry.split(",") if part.strip()]
    included = [part for part in parts if not part.startswith("!")]
    excluded = [part[1:] for part in parts if part.startswith("!")]
    if any(fnmatch.fnmatchcase(namespace, pattern) for pattern in excluded):
        return False
    return not included or any(fnmatch.fnmatchcase(namespace, pattern) for pattern in included)


def replicas_of(leases: Sequence[Mapping[str, Any]]) -> list[Replica]:
    found = []
    for lease in leases:
        metadata = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        published = (metadata.get("annotations") or {}).get(ANNOTATION_SERVES)
        found.append(
            Replica(
                namespace=str(metadata.get("namespace") or ""),
                group=str((metadata.get("labels") or {}).get(LABEL_REPLICA_GROUP) or ""),
                name=str(spec.get("holderIdentity") or metadata.get("name") or ""),
                serves=tuple(published.split(",")) if isinstance(published, str) and published else None,
                renewed=_time(spec.get("renewTime")),
                duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            )
        )
    return sorted(found, key=lambda r: (r.namespace, r.group, r.name))


def verdict(replicas: Sequence[Replica], namespace: str, now: dt.datetime) -> tuple[bool, str]:
    """Whether a live replica serves ``namespace``, and the sentence that says so."""
    live = [r for r in replicas if r.live(now)]
    serving = [r for r in live if r.serves_namespace(namespace)]
    if serving:
        groups = sorted({f"{r.namespace}/{r.group}" for r in serving})
        count = len(serving)
        return True, (
            f"namespace {namespace}: served by {', '.join(groups)} "
            f"({count} live replica{'s' if count != 1 else ''})"
        )
    if not replicas:
        return False, (
            f"namespace {namespace}: no operator replica found; an operator publishes a Lease when it "
            "runs with AGENTRUN_LEASE_NAMESPACE (as the chart runs it): without one, this cannot tell"
        )
    silent = sorted({f"{r.namespace}/{r.group}" for r in live if r.serves is None})
    if silent:
        return False, (
            f"namespace {namespace}: cannot tell whether it is served: live replicas of "
            f"{', '.join(silent)} do not publish what they serve (operators older than this plugin)"
        )
    elsewhere = sorted({entry for r in live for entry in (r.serves or ())})
    where = f" (the live ones serve: {', '.join(_named(elsewhere))})" if elsewhere else " (none is live)"
    return False, (
        f"namespace {namespace}: no live operator serves it; its runs get no phase until one does{where}"
    )


def render_operators(replicas: Sequence[Replica], namespace: str, now: dt.datetime) -> str:
    lines = []
    if replicas:
        rows = [["LEASE NAMESPACE", "GROUP", "REPLICA", "SERVES", "RENEWED"]]
        for replica in replicas:
            serves = ", ".join(_named(replica.serves)) if replica.serves is not None else "(not published)"
            renewed = _ago(replica.renewed, now)
            rows.append(
                [
                    replica.namespace,
                    replica.group,
                    replica.name,
                    serves,
                    renewed if replica.live(now) else f"{renewed} (expired)",
                ]
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += [
            "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
        ]
        lines.append("")
    lines.append(verdict(replicas, namespace, now)[1])
    return "\n".join(lines) + "\n"


def _named(entries: Sequence[str]) -> list[str]:
    return ["all namespaces" if entry == ALL else entry for entry in entries]


def _ago(when: dt.datetime | None, now: dt.datetime) -> str:
    if when is None:
        return "never"
    seconds = max(0, int((now - when).total_seconds()))
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


def _time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)
