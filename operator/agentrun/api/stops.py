"""Why a run ended: the vocabulary shared by the loop, status, metrics and docs/stop-reasons.md."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class StopReason(StrEnum):
    END_TURN = "EndTurn"
    FINISH_SEQUENCE = "FinishSequence"
    MAX_ITERATIONS = "MaxIterations"
    MAX_TOKENS = "MaxTokens"
    TOKEN_BUDGET_EXCEEDED = "TokenBudgetExceeded"
    COST_BUDGET_EXCEEDED = "CostBudgetExceeded"
    TIMEOUT = "Timeout"
    LOOP_DETECTED = "LoopDetected"
    TOO_MANY_TOOL_ERRORS = "TooManyToolErrors"
    FATAL_TOOL_ERROR = "FatalToolError"
    REFUSAL = "Refusal"
    CONTEXT_WINDOW_EXCEEDED = "ContextWindowExceeded"
    DELIVERABLE_UNVERIFIED = "DeliverableUnverified"
    INVALID_OUTPUT = "InvalidOutput"
    STOP_SEQUENCE_DRIFT = "StopSequenceDrift"
    UNEXPECTED_STOP_REASON = "UnexpectedStopReason"
    CANCELLED = "Cancelled"
    MODEL_ERROR = "ModelError"
    QUOTA_EXCEEDED = "QuotaExceeded"
    INVALID_SPEC = "InvalidSpec"

    @property
    def succeeded(self) -> bool:
        """Only a natural finish counts as success; every limit is a failure worth alerting on."""
        return self in (StopReason.END_TURN, StopReason.FINISH_SEQUENCE)


@dataclass(frozen=True)
class Outcome:
    """The terminal result of a run, translated to Kubernetes conditions by api.conditions."""

    stop_reason: StopReason
    message: str
    result: str | None = None
    # The condition reason when it should be more specific than the stop reason
    # (e.g. AuthenticationFailed for a ModelError caused by a 401).
    condition_reason: str | None = None
    raw_stop_reason: str | None = None
    # The answer as JSON, validated against spec.output.schema; None without a schema (a JSON
    # null answer is None too: status cannot hold a null field, result still has "null").
    output: Any = None
