"""The per-run limits the namespace's quotas put on one run: refused maxima and applied defaults.

A run that declares a limit above a quota's perRun max is refused (the ValidatingAdmissionPolicy does
it at the API server where installed; this is the operator's own check for where it is not). A run
that declares none gets the smallest default among the quotas; without a default, the built-in one
capped at the smallest max (tokenBudget and costBudgetUSD have no built-in default: they get the
smallest max, if any). What a quota set is recorded in status.quotaLimits, so a resumed run keeps it
even if the quotas changed meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentrun.api.spec import AgentRunSpec, Limits
from agentrun.api.status import QuotaLimits
from agentrun.quotas.ledger import QuotaDefinition

Amount = int | Decimal

#: status.quotaLimits / perRun names → spec.limits field names (Python).
FIELDS = {
    "tokenBudget": "token_budget",
    "costBudgetUSD": "cost_budget_usd",
    "maxIterations": "max_iterations",
    "timeoutSeconds": "timeout_seconds",
}
_BUILT_IN: Mapping[str, Amount] = {
    "maxIterations": int(Limits.model_fields["max_iterations"].default),
    "timeoutSeconds": int(Limits.model_fields["timeout_seconds"].default),
}


def declared(raw_spec: Mapping[str, Any]) -> dict[str, Amount | None]:
    """The per-run limits the run's manifest sets itself (None: left out)."""
    limits = raw_spec.get("limits") or {}
    found: dict[str, Amount | None] = {}
    for api_name, field in FIELDS.items():
        value = limits.get(api_name, limits.get(field))
        if value is None or isinstance(value, bool):
            found[api_name] = None
        elif isinstance(value, int):
            found[api_name] = value
        else:
            found[api_name] = Decimal(str(value))
    return found


@dataclass(frozen=True)
class Violation:
    quota: str
    field: str  # tokenBudget, costBudgetUSD, maxIterations or timeoutSeconds
    message: str


def violation(definitions: Sequence[QuotaDefinition], raw_spec: Mapping[str, Any]) -> Violation | None:
    """The first quota (by name) whose perRun max the run's own limits pass, said in one line."""
    limits = declared(raw_spec)
    for definition in definitions:
        problem = definition.per_run_violation(limits)
        if problem is None:
            continue
        field = next(
            (
                name
                for name, value in limits.items()
                if value is not None
                and (entry := definition.per_run.get(name)) is not None
                and entry.max is not None
                and value > entry.max
            ),
            next((name for name in FIELDS if name in problem), "limits"),
        )
        return Violation(definition.name, field, problem)
    return None


def imposed(definitions: Sequence[QuotaDefinition], raw_spec: Mapping[str, Any]) -> QuotaLimits | None:
    """The limits the quotas set for what the run left out; None when they set nothing."""
    own = declared(raw_spec)
    values: dict[str, Amount] = {}
    for api_name in FIELDS:
        if own[api_name] is not None:
            continue
        entries = [d.per_run.get(api_name) for d in definitions]
        defaults = [e.default for e in entries if e is not None and e.default is not None]
        maxima = [e.max for e in entries if e is not None and e.max is not None]
        if defaults:
            value = min(defaults)
            if maxima:
                value = min(value, min(maxima))
        elif maxima:
            built_in = _BUILT_IN.get(api_name)
            value = min(maxima) if built_in is None else min(built_in, min(maxima))
        else:
            continue
        values[api_name] = value
    if not values:
        return None
    return QuotaLimits.model_validate(
        {k: (float(v) if k == "costBudgetUSD" else int(v)) for k, v in values.items()}
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
        FIELDS[api_name]: value
        for api_name, value in limits.model_dump(by_alias=True, exclude_none=True).items()
        if api_name in FIELDS
    }
    if not update:
        return spec
    return spec.model_copy(update={"limits": spec.limits.model_copy(update=update)})
