"""The per-run limits of one run, between the AgentRun object and the pure policy (quotas/per_run.py).

What the run declares is read from its spec; what the quotas impose is recorded in
status.quotaLimits, so a resumed run keeps it even if the quotas changed meanwhile, and applied to
the typed spec the loop uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import QuotaLimits
from agentrun.quotas.definitions import DOLLAR_FIELDS, Amount, QuotaDefinition
from agentrun.quotas.per_run import (
    LIMITS_ATTRIBUTES,
    PER_RUN_FIELDS,
    PerRunViolation,
    imposed_limits,
    per_run_violation,
)


def declared(raw_spec: Mapping[str, Any]) -> dict[str, Amount | None]:
    """The per-run limits the run's manifest sets itself (None: left out)."""
    limits = raw_spec.get("limits") or {}
    found: dict[str, Amount | None] = {}
    for api_name in PER_RUN_FIELDS:
        value = limits.get(api_name, limits.get(LIMITS_ATTRIBUTES[api_name]))
        if value is None or isinstance(value, bool):
            found[api_name] = None
        elif isinstance(value, int):
            found[api_name] = value
        else:
            found[api_name] = Decimal(str(value))
    return found


def violation(definitions: Sequence[QuotaDefinition], raw_spec: Mapping[str, Any]) -> PerRunViolation | None:
    """The first quota (by name) whose perRun max the run's own limits pass, said in one line."""
    return per_run_violation(definitions, declared(raw_spec))


def imposed(definitions: Sequence[QuotaDefinition], raw_spec: Mapping[str, Any]) -> QuotaLimits | None:
    """The limits the quotas set for what the run left out; None when they set nothing."""
    values = imposed_limits(definitions, declared(raw_spec))
    if not values:
        return None
    return QuotaLimits.model_validate(
        {k: (float(v) if k in DOLLAR_FIELDS else int(v)) for k, v in values.items()}
    )


def recorded(status: Mapping[str, Any]) -> QuotaLimits | None:
    raw = status.get("quotaLimits")
    if not isinstance(raw, Mapping):
        return None
    limits = QuotaLimits.model_validate(raw)
    return limits if limits.model_dump(exclude_none=True) else None


def applied(spec: AgentRunSpec, limits: QuotaLimits | None) -> AgentRunSpec:
    """``spec`` with the quota's limits in spec.limits, as the loop uses them."""
    if limits is None:
        return spec
    update = {
        LIMITS_ATTRIBUTES[api_name]: value
        for api_name, value in limits.model_dump(by_alias=True, exclude_none=True).items()
        if api_name in LIMITS_ATTRIBUTES
    }
    if not update:
        return spec
    return spec.model_copy(update={"limits": spec.limits.model_copy(update=update)})
