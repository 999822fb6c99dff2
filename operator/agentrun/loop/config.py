"""Everything the loop needs to know about one run, derived once from the AgentRun spec."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.api.spec import AgentRunSpec


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for transient model errors. Ours is the only retry layer (the SDK's is off)."""

    max_retries: int = 6
    base_seconds: float = 1.0
    max_seconds: float = 60.0

    def backoff(self, attempt: int, jitter: float) -> float:
        """Exponential with full-range jitter in [0.5, 1.5), so many runs don't retry in lockstep."""
        raw = min(self.max_seconds, self.base_seconds * (2 ** (attempt - 1)))
        return float(raw * (0.5 + jitter))


@dataclass(frozen=True)
class LoopConfig:
    run_id: str
    task: str
    model: str
    max_tokens: int
    system: str | None = None
    temperature: float | None = None
    stop_sequences: tuple[str, ...] = ()
    finish_sequences: tuple[str, ...] = ()
    first_tool_choice: dict[str, Any] | None = None
    required_tools: tuple[str, ...] = ()
    max_iterations: int = 20
    token_budget: int | None = None
    cost_budget_usd: Decimal | None = None
    timeout_seconds: float = 1800.0
    tool_concurrency: int = 8
    tool_timeout_seconds: float = 120.0
    max_tool_result_chars: int = 20_000
    max_consecutive_tool_errors: int = 5
    loop_detection: bool = True
    loop_repeats: int = 3
    loop_failures_per_tool: int = 5
    # How long a call of a requiresApproval tool waits for a decision before it is denied.
    approval_timeout_seconds: float = 600.0
    # Bounds on the corrective turns the loop may spend on one response kind.
    max_continuations: int = 3
    max_reissues: int = 3
    max_drift_reprompts: int = 2
    max_deliverable_nudges: int = 2
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def from_spec(
        cls,
        spec: AgentRunSpec,
        *,
        run_id: str,
        retry: RetryPolicy | None = None,
        approval_timeout_seconds: float = 600.0,
    ) -> LoopConfig:
        """`approval_timeout_seconds` is the operator's default, used when the spec sets none."""
        limits = spec.limits
        choice: dict[str, Any] | None = None
        if spec.tool_choice is not None and spec.tool_choice.type != "auto":
            choice = {"type": spec.tool_choice.type}
            if spec.tool_choice.name is not None:
                choice["name"] = spec.tool_choice.name
        return cls(
            run_id=run_id,
            task=spec.task,
            model=spec.model.name,
            max_tokens=spec.model.max_tokens,
            system=spec.system_prompt,
            temperature=spec.model.temperature,
            stop_sequences=tuple(spec.model.stop_sequences),
            finish_sequences=tuple(spec.model.finish_sequences),
            first_tool_choice=choice,
            required_tools=tuple(spec.required_tools),
            max_iterations=limits.max_iterations,
            token_budget=limits.token_budget,
            cost_budget_usd=(
                Decimal(str(limits.cost_budget_usd)) if limits.cost_budget_usd is not None else None
            ),
            timeout_seconds=float(limits.timeout_seconds),
            tool_concurrency=limits.tool_concurrency,
            tool_timeout_seconds=float(limits.tool_timeout_seconds),
            max_tool_result_chars=limits.max_tool_result_chars,
            max_consecutive_tool_errors=limits.max_consecutive_tool_errors,
            loop_detection=limits.loop_detection.enabled,
            loop_repeats=limits.loop_detection.repeats,
            loop_failures_per_tool=limits.loop_detection.failures_per_tool,
            approval_timeout_seconds=float(
                limits.approval_timeout_seconds
                if limits.approval_timeout_seconds is not None
                else approval_timeout_seconds
            ),
            retry=retry or RetryPolicy(),
        )
