"""The AgentRunQuota API: a namespace's limits on runs, tokens and dollars, and the ledger it keeps.

Like AgentRun, the CRD is generated from these models, so descriptions are ``kubectl explain`` text
and every bound is enforced by the API server. The spec is a team's budget; the status is the ledger
the operator keeps against it (written only by the quota ledger writer, whole, with its
resourceVersion), so a second operator process or a restarted one resumes from it exactly.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, JsonValue, model_validator

from agentrun.api.sandbox_spec import QUANTITY_PATTERN
from agentrun.api.spec_base import SpecModel
from agentrun.api.status import StatusModel

#: The limits a quota can cap and default on each run, by their name under spec.limits.
PER_RUN_FIELDS = ("tokenBudget", "costBudgetUSD", "maxIterations", "timeoutSeconds")
#: The hard limits of a window (and concurrentRuns and the sandboxes'), by their name under spec.hard.
HARD_FIELDS = (
    "concurrentRuns",
    "runs",
    "tokens",
    "costUSD",
    "concurrentSandboxes",
    "sandboxCPU",
    "sandboxMemory",
)

MAX_ITERATIONS = 10_000
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


class QuotaWindow(StrEnum):
    HOUR = "Hour"
    DAY = "Day"
    MONTH = "Month"


class QuotaHard(SpecModel):
    """Hard limits; each is optional, and one left out is not limited by this quota."""

    concurrent_runs: int | None = Field(
        default=None,
        ge=0,
        description="Runs admitted and not finished at the same time; further runs wait in Pending.",
    )
    runs: int | None = Field(
        default=None,
        ge=0,
        description="Runs started within the window; further runs wait in Pending until older starts expire.",
    )
    tokens: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Input + output + cache-creation + cache-read tokens within the window, counting what model "
            "requests in flight may still spend; a request that does not fit is not sent."
        ),
    )
    cost_usd: float | None = Field(
        default=None,
        alias="costUSD",
        ge=0,
        description=(
            "US dollars within the window, priced by the operator's price table, counting what model "
            "requests in flight may still spend; a request that does not fit is not sent."
        ),
    )
    concurrent_sandboxes: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Runs with a sandbox (spec.sandbox) admitted and not finished at the same time; further runs "
            "with a sandbox wait in Pending. Runs without one are not counted."
        ),
    )
    sandbox_cpu: str | None = Field(
        default=None,
        alias="sandboxCPU",
        pattern=QUANTITY_PATTERN,
        max_length=64,
        description=(
            "Sum of the CPU limits (spec.sandbox.resources.limits.cpu) of the admitted runs with a "
            "sandbox, a quantity such as 4 or 1500m; a run whose sandbox does not fit waits in Pending."
        ),
    )
    sandbox_memory: str | None = Field(
        default=None,
        alias="sandboxMemory",
        pattern=QUANTITY_PATTERN,
        max_length=64,
        description=(
            "Sum of the memory limits (spec.sandbox.resources.limits.memory) of the admitted runs with "
            "a sandbox, a quantity such as 8Gi; a run whose sandbox does not fit waits in Pending."
        ),
    )


#: The default of a per-run limit may not exceed its maximum (checked by the API server).
DEFAULT_NOT_ABOVE_MAX: dict[str, JsonValue] = {
    "rule": "!has(self.max) || !has(self.default) || self.default <= self.max",
    "message": "default must not be above max",
}


class _PerRunLimit(SpecModel):
    """A maximum and a default, the default not above the maximum (CEL for the API server, a validator
    here for pydantic)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [DEFAULT_NOT_ABOVE_MAX]})

    @model_validator(mode="after")
    def _default_not_above_max(self) -> Self:
        maximum, default = getattr(self, "max", None), getattr(self, "default", None)
        if maximum is not None and default is not None and default > maximum:
            raise ValueError(f"default {default} must not be above max {maximum}")
        return self


class TokenBudgetLimit(_PerRunLimit):
    """The largest spec.limits.tokenBudget a run may declare, and the one a run declaring none gets."""

    max: int | None = Field(default=None, ge=1, description="Largest tokenBudget a run may declare.")
    default: int | None = Field(
        default=None, ge=1, description="tokenBudget of a run that declares none; at most max."
    )


class CostBudgetLimit(_PerRunLimit):
    """The largest spec.limits.costBudgetUSD a run may declare, and the one a run declaring none gets."""

    max: float | None = Field(
        default=None, gt=0, description="Largest costBudgetUSD (US dollars) a run may declare."
    )
    default: float | None = Field(
        default=None, gt=0, description="costBudgetUSD of a run that declares none; at most max."
    )


class MaxIterationsLimit(_PerRunLimit):
    """The largest spec.limits.maxIterations a run may declare, and the one a run declaring none gets."""

    max: int | None = Field(
        default=None, ge=1, le=MAX_ITERATIONS, description="Largest maxIterations a run may declare."
    )
    default: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ITERATIONS,
        description="maxIterations of a run that declares none; at most max.",
    )


class TimeoutSecondsLimit(_PerRunLimit):
    """The largest spec.limits.timeoutSeconds a run may declare, and the one a run declaring none gets."""

    max: int | None = Field(
        default=None, ge=1, le=MAX_TIMEOUT_SECONDS, description="Largest timeoutSeconds a run may declare."
    )
    default: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TIMEOUT_SECONDS,
        description="timeoutSeconds of a run that declares none; at most max.",
    )


class QuotaPerRun(SpecModel):
    """Per-run maxima and defaults. A run above a maximum is refused; one declaring none gets the
    smallest default among its namespace's quotas."""

    token_budget: TokenBudgetLimit | None = Field(
        default=None, description="Bounds of spec.limits.tokenBudget (whole-run tokens)."
    )
    cost_budget_usd: CostBudgetLimit | None = Field(
        default=None,
        alias="costBudgetUSD",
        description="Bounds of spec.limits.costBudgetUSD (whole-run US dollars).",
    )
    max_iterations: MaxIterationsLimit | None = Field(
        default=None, description="Bounds of spec.limits.maxIterations (model requests)."
    )
    timeout_seconds: TimeoutSecondsLimit | None = Field(
        default=None, description="Bounds of spec.limits.timeoutSeconds (wall clock)."
    )


class AgentRunQuotaSpec(SpecModel):
    """Limits on the AgentRuns of this namespace; every quota of a namespace applies to each run."""

    window: QuotaWindow = Field(
        default=QuotaWindow.DAY,
        description=(
            "Window of hard.runs, hard.tokens and hard.costUSD: Hour or Day (rolling) or Month "
            "(the calendar month, UTC)."
        ),
    )
    hard: QuotaHard = Field(
        default_factory=QuotaHard, description="Hard limits of the namespace; each one is optional."
    )
    per_run: QuotaPerRun | None = Field(
        default=None,
        description="Largest limits one run may declare, and defaults for runs that declare none.",
    )


# --------------------------------------------------------------------------------------------------------
# Status: the ledger


class QuotaUsed(StatusModel):
    """Usage counted against the hard limits."""

    concurrent_runs: int = Field(default=0, description="Runs admitted and not finished.")
    runs: int = Field(default=0, description="Runs started within the window.")
    tokens: int = Field(default=0, description="Tokens of settled model requests within the window.")
    cost_usd: str = Field(
        default="0",
        alias="costUSD",
        description="US dollars of settled model requests within the window, as a decimal string.",
    )
    # The sandbox counts are written only by a quota that limits sandboxes or holds one (as a
    # ResourceQuota shows what it limits), so the status of every other quota keeps its shape.
    concurrent_sandboxes: int | None = Field(
        default=None, description="Runs with a sandbox admitted and not finished."
    )
    sandbox_cpu: str | None = Field(
        default=None,
        alias="sandboxCPU",
        description="CPU limits of the sandboxes of those runs, summed, as a Kubernetes quantity.",
    )
    sandbox_memory: str | None = Field(
        default=None,
        alias="sandboxMemory",
        description="Memory limits of the sandboxes of those runs, summed, as a Kubernetes quantity.",
    )


class QuotaReserved(StatusModel):
    """What model requests in flight may still spend, held until their answers are counted."""

    tokens: int = Field(default=0, description="Tokens reserved by requests in flight.")
    cost_usd: str = Field(
        default="0",
        alias="costUSD",
        description="US dollars reserved by requests in flight, as a decimal string.",
    )


class QuotaSummary(StatusModel):
    """Used against hard, as `kubectl get agentrunquota` shows it ("2/5"; just "2" without a limit)."""

    concurrent_runs: str = Field(default="", description="Runs admitted and not finished, against the limit.")
    runs: str = Field(default="", description="Runs started within the window, against the limit.")
    tokens: str = Field(
        default="", description="Tokens used and reserved within the window, against the limit."
    )
    cost_usd: str = Field(
        default="",
        alias="costUSD",
        description="US dollars used and reserved within the window, against the limit.",
    )
    concurrent_sandboxes: str | None = Field(
        default=None, description="Runs with a sandbox admitted and not finished, against the limit."
    )
    sandbox_cpu: str | None = Field(
        default=None, alias="sandboxCPU", description="CPU limits of admitted sandboxes, against the limit."
    )
    sandbox_memory: str | None = Field(
        default=None,
        alias="sandboxMemory",
        description="Memory limits of admitted sandboxes, against the limit.",
    )


class QuotaAdmittedSandbox(StatusModel):
    """The sandbox an admitted run holds, by its limits (what the sandbox limits count)."""

    cpu: str = Field(description="Its CPU limit, as a Kubernetes quantity.")
    memory: str = Field(description="Its memory limit, as a Kubernetes quantity.")


class QuotaAdmission(StatusModel):
    """A run admitted by the quota and not finished: one of concurrentRuns."""

    uid: str = Field(description="UID of the AgentRun.")
    name: str = Field(description="Name of the AgentRun.")
    at: str = Field(description="When it was admitted (RFC 3339).")
    sandbox: QuotaAdmittedSandbox | None = Field(
        default=None,
        description="Its sandbox, if it has one (counted in concurrentSandboxes, sandboxCPU, sandboxMemory).",
    )


class QuotaReservation(StatusModel):
    """The most one model request in flight may cost, held until its answer is counted."""

    uid: str = Field(description="UID of the AgentRun making the request.")
    name: str = Field(description="Name of the AgentRun making the request.")
    id: str = Field(description="The request, unique within its run.")
    holder: str = Field(
        description="<operator id>/<execution>: the run execution that sends the request; another one "
        "finding it charges it in full."
    )
    tokens: int = Field(default=0, description="Tokens reserved.")
    cost_usd: str | None = Field(
        default=None, alias="costUSD", description="US dollars reserved, as a decimal string."
    )
    at: str = Field(description="When it was reserved (RFC 3339).")


class QuotaBucket(StatusModel):
    """Usage that started within one slice of the window (Hour: 1 minute; Day: 15 minutes; Month: 1 day)."""

    start: str = Field(
        description="Start of the slice (RFC 3339); it counts while its end is within the window."
    )
    runs: int = Field(default=0, description="Runs started in the slice.")
    tokens: int = Field(default=0, description="Tokens settled in the slice.")
    cost_usd: str = Field(
        default="0", alias="costUSD", description="US dollars settled in the slice, as a decimal string."
    )


class QuotaLost(StatusModel):
    """Reservations charged in full: their operator stopped before the answer was recorded."""

    requests: int = Field(default=0, description="Requests charged in full.")
    tokens: int = Field(default=0, description="Tokens charged for them.")
    cost_usd: str = Field(
        default="0", alias="costUSD", description="US dollars charged for them, as a decimal string."
    )


class QuotaRefusals(StatusModel):
    """What the quota refused since it was created."""

    runs: int = Field(default=0, description="Times a run was held back at admission.")
    requests: int = Field(default=0, description="Model requests that could not be reserved.")


class QuotaLedgerCopy(StatusModel):
    """Set when the ledger is kept in PostgreSQL (AGENTRUN_QUOTA_LEDGER=postgres): this status is then a
    copy of its totals, without the lists of admitted runs and reservations."""

    store: str = Field(description="Where the ledger is kept: postgres.")
    version: int = Field(description="The ledger's change this copy shows (they are counted from 1).")
    admitted: int = Field(
        default=0, description="Runs admitted and not finished (their list is in the ledger)."
    )
    reservations: int = Field(
        default=0, description="Reservations outstanding (their list is in the ledger)."
    )


class AgentRunQuotaStatus(StatusModel):
    """The quota's ledger, written by the operator only."""

    observed_generation: int | None = Field(default=None, description="Spec generation the ledger reflects.")
    window_start: str | None = Field(
        default=None,
        description=(
            "Start of the window at the last write (RFC 3339): the start of the month, or the last "
            "write minus the rolling window."
        ),
    )
    used: QuotaUsed = Field(default_factory=QuotaUsed, description="Usage counted against the hard limits.")
    reserved: QuotaReserved = Field(
        default_factory=QuotaReserved, description="What model requests in flight may still spend."
    )
    summary: QuotaSummary = Field(
        default_factory=QuotaSummary, description="Used against hard, for `kubectl get agentrunquota`."
    )
    admitted: list[QuotaAdmission] = Field(
        default_factory=list,
        description="Runs admitted and not finished (concurrentRuns), with their sandboxes.",
    )
    reservations: list[QuotaReservation] = Field(
        default_factory=list, description="Reservations outstanding, one per model request in flight."
    )
    buckets: list[QuotaBucket] = Field(
        default_factory=list, description="Usage by slice of the window, oldest first."
    )
    lost: QuotaLost = Field(
        default_factory=QuotaLost,
        description=(
            "Reservations charged in full because their operator stopped before the answer was recorded."
        ),
    )
    refused: QuotaRefusals = Field(
        default_factory=QuotaRefusals, description="Refusals since the quota was created."
    )
    ledger: QuotaLedgerCopy | None = Field(
        default=None,
        description="Where the ledger is kept, when not here: this status is then a copy of its totals.",
    )
