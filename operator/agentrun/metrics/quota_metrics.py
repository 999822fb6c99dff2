"""The quota families of the operator's metrics: gauges that mirror each AgentRunQuota's status, and
the refusals counted as they happen.

Why gauges from the status: the ledger lives in the quota's status and every replica writes it, so any
replica's scrape shows the shared numbers, not only what this replica did.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from agentrun.api.quota import HARD_FIELDS
from agentrun.quotas.quantities import QuantityError, parse_quantity

#: Every hard limit a quota may set is a resource of the quota series.
QUOTA_RESOURCES = HARD_FIELDS
RESERVED_RESOURCES = ("tokens", "costUSD")
QUOTA_STAGES = ("admission", "request", "spec")


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _amount(value: object) -> float | None:
    """A count, a decimal string ("0.123456", as the ledger writes dollars) or a Kubernetes quantity
    ("1500m" cores, "8Gi" bytes, as it writes sandbox CPU and memory); None if it is none of them."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float | Decimal):
        return float(value)
    if isinstance(value, str):
        try:
            amount = Decimal(value.strip())
        except ArithmeticError:
            try:
                amount = parse_quantity(value.strip())
            except QuantityError:
                return None
        return float(amount) if amount.is_finite() else None
    return None


def _limits_from_summary(summary: object) -> dict[str, str]:
    """{"runs": "100"} from {"runs": "10/100"}; an entry without "/" has no limit."""
    return {
        resource: cell.partition("/")[2]
        for resource, cell in _mapping(summary).items()
        if isinstance(cell, str) and "/" in cell
    }


class QuotaMetrics:
    """The quota families; :class:`~agentrun.metrics.definitions.Metrics` has them as its own."""

    def _init_quota_metrics(self, registry: CollectorRegistry) -> None:
        """Gauges mirror each AgentRunQuota's status, so any replica's scrape shows the shared ledger."""
        labels = ["namespace", "quota", "resource"]
        self.quota_hard = Gauge(
            "agentrun_quota_hard",
            "Hard limit of an AgentRunQuota (costUSD in US dollars, sandboxCPU in cores, sandboxMemory in "
            "bytes); no series for an unlimited resource.",
            labels,
            registry=registry,
        )
        self.quota_used = Gauge(
            "agentrun_quota_used",
            "Usage an AgentRunQuota counts: concurrentRuns and the sandboxes' (count, CPU cores, memory "
            "bytes) now, runs/tokens/costUSD in its window.",
            labels,
            registry=registry,
        )
        self.quota_reserved = Gauge(
            "agentrun_quota_reserved",
            "Tokens and US dollars reserved by model requests in flight, not settled yet.",
            labels,
            registry=registry,
        )
        self.quota_lost = Gauge(
            "agentrun_quota_lost_reservations",
            "Reservations charged in full because the operator holding them stopped before the answer "
            "was recorded (status.lost.requests).",
            ["namespace", "quota"],
            registry=registry,
        )
        self.quota_refusals = Counter(
            "agentrun_quota_refusals",
            "Refusals by an AgentRunQuota: stage admission (a run held back), request (a model request "
            "not sent) or spec (a run declaring more than a per-run maximum).",
            ["namespace", "quota", "resource", "stage"],
            registry=registry,
        )
        self._quota_refusal_labels: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def observe_quota(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any] | None,
        *,
        hard: Mapping[str, Any] | None = None,
    ) -> None:
        """Sets the quota's gauges from its status; ``hard`` is its spec.hard.

        Without ``hard`` the limits are read back from status.summary ("used/hard"), which the ledger
        writes with every status. A limit removed from the spec loses its series, so a dashboard never
        compares usage with a limit that no longer exists.
        """
        status = status or {}
        limits = hard if hard is not None else _limits_from_summary(status.get("summary"))
        used = _mapping(status.get("used"))
        reserved = _mapping(status.get("reserved"))
        for resource in QUOTA_RESOURCES:
            limit = _amount(limits.get(resource))
            if limit is None:
                self.quota_hard.remove(namespace, name, resource)
            else:
                self.quota_hard.labels(namespace, name, resource).set(limit)
                # Present from 0 on, so rate() and increase() count the first refusal too.
                for stage in ("admission", "request") if resource in RESERVED_RESOURCES else ("admission",):
                    self._refusals(namespace, name, resource, stage)
            self.quota_used.labels(namespace, name, resource).set(_amount(used.get(resource)) or 0.0)
        for resource in RESERVED_RESOURCES:
            self.quota_reserved.labels(namespace, name, resource).set(_amount(reserved.get(resource)) or 0.0)
        lost = _amount(_mapping(status.get("lost")).get("requests")) or 0.0
        self.quota_lost.labels(namespace, name).set(lost)

    def forget_quota(self, namespace: str, name: str) -> None:
        """A deleted quota's series go with it (they would otherwise show its last usage forever)."""
        for resource in QUOTA_RESOURCES:
            self.quota_hard.remove(namespace, name, resource)
            self.quota_used.remove(namespace, name, resource)
        for resource in RESERVED_RESOURCES:
            self.quota_reserved.remove(namespace, name, resource)
        self.quota_lost.remove(namespace, name)
        for resource, stage in self._quota_refusal_labels.pop((namespace, name), set()):
            self.quota_refusals.remove(namespace, name, resource, stage)

    def quota_refused(self, namespace: str, quota: str, resource: str, stage: str) -> None:
        """``resource`` is the limit that refused (for stage spec, the per-run field, e.g. tokenBudget)."""
        if stage not in QUOTA_STAGES:  # a typo would silently start a series no dashboard queries
            raise ValueError(f"quota refusal stage must be one of {', '.join(QUOTA_STAGES)}, not {stage!r}")
        self._refusals(namespace, quota, resource, stage).inc()

    def _refusals(self, namespace: str, quota: str, resource: str, stage: str) -> Counter:
        self._quota_refusal_labels.setdefault((namespace, quota), set()).add((resource, stage))
        return self.quota_refusals.labels(namespace, quota, resource, stage)
