"""What an AgentRunQuota limits, read from the object as the API server stores it.

Why from the plain dict and not the pydantic model of api/quota.py: the ledger must read every
version of the object the API server hands out (also one stored before a field was added), and a
loader that refuses an object would leave a namespace unlimited. The CRD schema already validated
the spec; what is checked here again is only what the arithmetic relies on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentrun.api.quota import PER_RUN_FIELDS
from agentrun.quotas.formats import parse_decimal
from agentrun.quotas.quantities import QuantityError, parse_quantity
from agentrun.quotas.windows import Window

#: Per-run limits counted in dollars (all others are whole numbers).
DOLLAR_FIELDS = frozenset({"costBudgetUSD"})

Amount = int | Decimal


class QuotaSpecError(ValueError):
    """An AgentRunQuota whose spec the ledger cannot count against; the message is one line."""


@dataclass(frozen=True)
class Hard:
    concurrent_runs: int | None = None
    runs: int | None = None
    tokens: int | None = None
    cost_usd: Decimal | None = None
    concurrent_sandboxes: int | None = None
    #: Cores and bytes (exact), summed over the sandbox limits of the admitted runs.
    sandbox_cpu: Decimal | None = None
    sandbox_memory: Decimal | None = None


@dataclass(frozen=True)
class PerRunLimit:
    max: Amount | None = None
    default: Amount | None = None


@dataclass(frozen=True)
class QuotaDefinition:
    namespace: str
    name: str
    window: Window
    hard: Hard
    #: Every one of PER_RUN_FIELDS, with PerRunLimit() where the quota says nothing.
    per_run: Mapping[str, PerRunLimit]

    @property
    def label(self) -> str:
        """How every message names the quota."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> QuotaDefinition:
        """A whole AgentRunQuota object; QuotaSpecError (one line) for one the ledger cannot use."""
        metadata = _mapping(obj.get("metadata"))
        namespace, name = metadata.get("namespace"), metadata.get("name")
        if not isinstance(namespace, str) or not namespace or not isinstance(name, str) or not name:
            raise QuotaSpecError("an AgentRunQuota object needs metadata.namespace and metadata.name")
        label = f"AgentRunQuota {namespace}/{name}"
        spec = _mapping(obj.get("spec"))
        raw_window = spec.get("window", Window.DAY.value)
        try:
            window = Window(raw_window)
        except ValueError:
            choices = ", ".join(w.value for w in Window)
            raise QuotaSpecError(f"{label}: spec.window {raw_window!r} is not one of {choices}") from None
        hard = _mapping(spec.get("hard"))
        limits = Hard(
            concurrent_runs=_whole(hard, "concurrentRuns", 0, f"{label}: spec.hard"),
            runs=_whole(hard, "runs", 0, f"{label}: spec.hard"),
            tokens=_whole(hard, "tokens", 0, f"{label}: spec.hard"),
            cost_usd=_dollars(hard, "costUSD", f"{label}: spec.hard", positive=False),
            concurrent_sandboxes=_whole(hard, "concurrentSandboxes", 0, f"{label}: spec.hard"),
            sandbox_cpu=_quantity(hard, "sandboxCPU", f"{label}: spec.hard"),
            sandbox_memory=_quantity(hard, "sandboxMemory", f"{label}: spec.hard"),
        )
        per_run_spec = _mapping(spec.get("perRun"))
        per_run = {field: _per_run(per_run_spec, field, f"{label}: spec.perRun") for field in PER_RUN_FIELDS}
        return cls(namespace=namespace, name=name, window=window, hard=limits, per_run=per_run)


def _mapping(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _whole(values: Mapping[str, Any], key: str, minimum: int, where: str) -> int | None:
    raw = values.get(key)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise QuotaSpecError(f"{where}.{key} must be a whole number >= {minimum}, got {raw!r}")
    return raw


def _dollars(values: Mapping[str, Any], key: str, where: str, *, positive: bool) -> Decimal | None:
    raw = values.get(key)
    if raw is None:
        return None
    amount = parse_decimal(raw)
    if amount is None or (positive and amount == 0):
        bound = "> 0" if positive else ">= 0"
        raise QuotaSpecError(f"{where}.{key} must be a number of US dollars {bound}, got {raw!r}")
    return amount


def _quantity(values: Mapping[str, Any], key: str, where: str) -> Decimal | None:
    raw = values.get(key)
    if raw is None:
        return None
    try:
        return parse_quantity(raw)
    except QuantityError as exc:
        raise QuotaSpecError(f"{where}.{key}: {exc}") from None


def _per_run(per_run: Mapping[str, Any], field: str, where: str) -> PerRunLimit:
    entry = _mapping(per_run.get(field))
    at = f"{where}.{field}"
    if field in DOLLAR_FIELDS:
        maximum: Amount | None = _dollars(entry, "max", at, positive=True)
        default: Amount | None = _dollars(entry, "default", at, positive=True)
    else:
        maximum = _whole(entry, "max", 1, at)
        default = _whole(entry, "default", 1, at)
    if maximum is not None and default is not None and default > maximum:
        raise QuotaSpecError(f"{at}: default {default} is above max {maximum}")
    return PerRunLimit(max=maximum, default=default)
