"""The per-run limits the namespace's quotas put on one run: the one policy, maxima and defaults.

A run that declares a limit above a quota's perRun max is refused (the ValidatingAdmissionPolicy does
it at the API server where installed; the operator checks it too, for where it is not). A limit the
run leaves out gets the smallest default among the quotas, capped at the smallest max; without a
default, the built-in one capped at the smallest max (tokenBudget and costBudgetUSD have no built-in
default: they get the smallest max, if any, else stay unlimited).

Why the smallest default wins, capped at the smallest max: every quota of the namespace applies,
so a run must fit all of them, and a default that one quota allows but another refuses would end a
run that declared nothing with InvalidSpec, for a choice it never made.

Limits are keyed by their API name (PER_RUN_FIELDS); ``declared`` holds what the run's manifest
itself sets (None or absent: left out). The controller (controller/quotas/limits.py) reads the
declared values from the run and writes what this imposes into status.quotaLimits and the spec.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from agentrun.api.quota import PER_RUN_FIELDS
from agentrun.api.spec import Limits
from agentrun.quotas.definitions import Amount, QuotaDefinition
from agentrun.quotas.messages import per_run_above

__all__ = [
    "BUILT_IN_DEFAULTS",
    "LIMITS_ATTRIBUTES",
    "PER_RUN_FIELDS",
    "PerRunViolation",
    "effective_limits",
    "imposed_limits",
    "per_run_violation",
]

#: Each per-run limit's attribute on the spec's Limits model (tokenBudget → token_budget).
LIMITS_ATTRIBUTES: Mapping[str, str] = {
    info.alias: name
    for name, info in Limits.model_fields.items()
    if info.alias is not None and info.alias in PER_RUN_FIELDS
}
#: What a run gets when it declares nothing and no quota defaults the field (tokenBudget and
#: costBudgetUSD have none: unlimited unless a quota caps them). The spec model's own defaults, so
#: a run under no quota and a run under quotas that say nothing get the same.
BUILT_IN_DEFAULTS: Mapping[str, Amount] = {
    field: int(default)
    for field in PER_RUN_FIELDS
    if (default := Limits.model_fields[LIMITS_ATTRIBUTES[field]].default) is not None
}


@dataclass(frozen=True)
class PerRunViolation:
    """A run's own limit above a quota's perRun max: the run ends InvalidSpec with ``message``."""

    quota: str  # the quota's name
    field: str  # one of PER_RUN_FIELDS
    message: str  # one sentence naming the quota, the field, the value and the max


def effective_limits(
    quotas: Iterable[QuotaDefinition], declared: Mapping[str, Amount | None]
) -> dict[str, Amount | None]:
    """Every per-run limit of a run: as declared, else what the quotas default it to.

    A value of None in the result means unlimited (only tokenBudget and costBudgetUSD can be).
    """
    quotas = list(quotas)
    result: dict[str, Amount | None] = {}
    for field in PER_RUN_FIELDS:
        own = declared.get(field)
        if own is not None:
            result[field] = own
            continue
        defaults = [d for q in quotas if (d := q.per_run[field].default) is not None]
        maxima = [m for q in quotas if (m := q.per_run[field].max) is not None]
        value: Amount | None = min(defaults) if defaults else BUILT_IN_DEFAULTS.get(field)
        if maxima:
            value = min(maxima) if value is None else min(value, min(maxima))
        result[field] = value
    return result


def imposed_limits(
    quotas: Iterable[QuotaDefinition], declared: Mapping[str, Amount | None]
) -> dict[str, Amount]:
    """Only the limits the quotas set for what the run left out (what status.quotaLimits records)."""
    quotas = list(quotas)
    effective = effective_limits(quotas, declared)
    return {
        field: value
        for field, value in effective.items()
        if value is not None
        and declared.get(field) is None
        and any(q.per_run[field].default is not None or q.per_run[field].max is not None for q in quotas)
    }


def per_run_violation(
    quotas: Iterable[QuotaDefinition], declared: Mapping[str, int | float | Decimal | None]
) -> PerRunViolation | None:
    """The first quota (by name) whose perRun max one of the run's own limits passes, at its first
    such field; None when every declared limit fits every quota.

    Compared as decimals, so a float from the manifest (costBudgetUSD 5.01) is not rounded under a max.
    """
    for quota in sorted(quotas, key=lambda q: q.name):
        for field in PER_RUN_FIELDS:
            value, maximum = declared.get(field), quota.per_run[field].max
            if value is not None and maximum is not None and Decimal(str(value)) > maximum:
                return PerRunViolation(quota.name, field, per_run_above(quota.label, field, value, maximum))
    return None
