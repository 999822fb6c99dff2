"""The per-run limits of one run, between the AgentRun object and the pure policy (quotas/per_run.py).

What the run declares is read from its spec; what the quotas impose is recorded in
status.quotaLimits, so a resumed run keeps it even if the quotas changed meanwhile, and applied to
the typed spec the loop uses. What its sandbox counts against the sandbox limits is read here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import TypeVar

from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus, QuotaLimits
from agentrun.quotas.definitions import DOLLAR_FIELDS, Amount, QuotaDefinition
from agentrun.quotas.per_run import (
    LIMITS_ATTRIBUTES,
    PER_RUN_FIELDS,
    PerRunViolation,
    imposed_limits,
    per_run_violation,
)
from agentrun.quotas.quantities import parse_quantity
from agentrun.quotas.records import SandboxUse

Spec = TypeVar("Spec", bound=AgentRunSpec)


def declared(spec: AgentRunSpec) -> dict[str, Amount | None]:
    """The per-run limits the run's manifest (or its Agent's) sets itself (None: left out)."""
    limits = spec.limits
    found: dict[str, Amount | None] = {}
    for api_name in PER_RUN_FIELDS:
        attribute = LIMITS_ATTRIBUTES[api_name]
        value = getattr(limits, attribute) if attribute in limits.model_fields_set else None
        found[api_name] = None if value is None else value if isinstance(value, int) else Decimal(str(value))
    return found


def violation(definitions: Sequence[QuotaDefinition], spec: AgentRunSpec) -> PerRunViolation | None:
    """The first quota (by name) whose perRun max the run's own limits pass, said in one line."""
    return per_run_violation(definitions, declared(spec))


def imposed(definitions: Sequence[QuotaDefinition], spec: AgentRunSpec) -> QuotaLimits | None:
    """The limits the quotas set for what the run left out; None when they set nothing."""
    values = imposed_limits(definitions, declared(spec))
    if not values:
        return None
    return QuotaLimits.model_validate(
        {k: (float(v) if k in DOLLAR_FIELDS else int(v)) for k, v in values.items()}
    )


def recorded(status: AgentRunStatus) -> QuotaLimits | None:
    """What the quotas set at the run's admission (status.quotaLimits), if anything."""
    limits = status.quota_limits
    return limits if limits is not None and limits.model_dump(exclude_none=True) else None


def applied(spec: Spec, limits: QuotaLimits | None) -> Spec:
    """``spec`` with the quota's limits in spec.limits, as the loop uses them (QuotaLimits names its
    fields as Limits does)."""
    update = limits.model_dump(exclude_none=True) if limits is not None else {}
    if not update:
        return spec
    return spec.model_copy(update={"limits": spec.limits.model_copy(update=update)})


def sandbox_use(spec: ResolvedRunSpec) -> SandboxUse | None:
    """What the run's sandbox counts against the sandbox limits: its limits (not its requests), as
    a ResourceQuota on limits.cpu and limits.memory counts a pod. The CRD's quantity pattern is the
    grammar parse_quantity reads, so a spec that was admitted always parses."""
    if spec.sandbox is None:
        return None
    limits = spec.sandbox.resources.limits
    return SandboxUse(cpu=parse_quantity(limits.cpu), memory=parse_quantity(limits.memory))
