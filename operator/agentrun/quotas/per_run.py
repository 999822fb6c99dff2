"""The per-run limits several quotas put on one run together.

Why the smallest default wins, capped at the smallest max: every quota of the namespace applies,
so a run must fit all of them, and a default that one quota allows but another refuses would end a
run that declared nothing with InvalidSpec, for a choice it never made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from agentrun.api.spec import Limits
from agentrun.quotas.definitions import PER_RUN_FIELDS, Amount, QuotaDefinition

#: What a run gets when it declares nothing and no quota defaults the field (tokenBudget and
#: costBudgetUSD have none: unlimited unless a quota caps them).
BUILT_IN_DEFAULTS: Mapping[str, int] = {
    "maxIterations": int(Limits.model_fields["max_iterations"].default),
    "timeoutSeconds": int(Limits.model_fields["timeout_seconds"].default),
}


def effective_limits(
    quotas: Iterable[QuotaDefinition], declared: Mapping[str, Amount | None]
) -> dict[str, Amount | None]:
    """Every per-run limit of a run: as declared, else what the quotas default it to.

    ``declared`` holds what the run's manifest itself sets (None or absent: left out). A value
    of None in the result means unlimited (only tokenBudget and costBudgetUSD can be).
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
    """Only the limits the quotas set for what the run left out (for status.quotaLimits)."""
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
    quotas: Iterable[QuotaDefinition], limits: Mapping[str, int | float | Decimal | None]
) -> str | None:
    """The first violation, quotas taken by name: the one sentence an InvalidSpec stop shows."""
    for quota in sorted(quotas, key=lambda q: q.name):
        problem = quota.per_run_violation(limits)
        if problem is not None:
            return problem
    return None
