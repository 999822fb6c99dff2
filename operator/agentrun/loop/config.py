"""Everything the loop needs to know about one run, derived once from the AgentRun spec."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.loop.answers import with_instructions
from agentrun.loop.protocols import ServerContextEdits, Thinking


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


#: Context windows in tokens per model name pattern (exact, or a prefix ending in "*"); the longest
#: matching pattern wins. Models with a larger window only with a beta header get the default one.
CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    ("claude-opus-4*", 200_000),
    ("claude-sonnet-4*", 200_000),
    ("claude-haiku-4*", 200_000),
    ("claude-3-7-sonnet*", 200_000),
    ("claude-3-5*", 200_000),
)


def context_window_of(model: str, table: Sequence[tuple[str, int]] = ()) -> int | None:
    """The window of `model`: the operator's entries (`table`) first, then the built-in ones."""
    for entries in (table, CONTEXT_WINDOWS):
        matching = [
            (len(pattern), not pattern.endswith("*"), tokens)
            for pattern, tokens in entries
            if (model.startswith(pattern[:-1]) if pattern.endswith("*") else model == pattern)
        ]
        if matching:
            return max(matching)[2]
    return None


@dataclass(frozen=True)
class ContextConfig:
    """spec.context, with the model's window resolved (None: unknown, so compaction cannot trigger)."""

    clear_tool_results: bool = True
    keep_tool_results: int = 8
    clear_min_chars: int = 1024
    clear_batch: int = 4
    compaction: bool = True
    threshold_percent: int = 80
    keep_turns: int = 2
    window_tokens: int | None = None
    # strategy Server: the Messages API does that part itself, and the loop does not.
    clear_on_server: bool = False
    compact_on_server: bool = False

    @property
    def threshold_tokens(self) -> int | None:
        """Where the loop compacts; None where it does not (off, on the server, or no window)."""
        if not self.compaction or self.compact_on_server or self.window_tokens is None:
            return None
        return self.window_tokens * self.threshold_percent // 100

    @property
    def server_edits(self) -> ServerContextEdits | None:
        """What the model adapter asks the Messages API to do; None: nothing, all is client-side."""
        clear = self.clear_tool_results and self.clear_on_server
        compact = self.compaction and self.compact_on_server
        if not (clear or compact):
            return None
        return ServerContextEdits(
            clear_keep=self.keep_tool_results if clear else None,
            clear_trigger=self.keep_tool_results + self.clear_batch if clear else None,
            compact=compact,
            compact_trigger_tokens=(
                self.window_tokens * self.threshold_percent // 100
                if compact and self.window_tokens is not None
                else None
            ),
        )


@dataclass(frozen=True)
class LoopConfig:
    run_id: str
    task: str
    model: str
    max_tokens: int
    system: str | None = None
    temperature: float | None = None
    thinking: Thinking | None = None
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
    # spec.output: the schema a final answer must match (None: free text), and its retries.
    output_schema: dict[str, Any] | None = None
    max_output_retries: int = 2
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    context: ContextConfig = field(default_factory=ContextConfig)

    @classmethod
    def from_spec(
        cls,
        spec: AgentRunSpec,
        *,
        run_id: str,
        retry: RetryPolicy | None = None,
        approval_timeout_seconds: float = 600.0,
        context_windows: Sequence[tuple[str, int]] = (),
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
            # The answer's schema goes into the system prompt: stable, so cached, and never
            # compacted away like an early user turn could be.
            system=(
                with_instructions(spec.system_prompt, spec.output.json_schema)
                if spec.output is not None
                else spec.system_prompt
            ),
            output_schema=dict(spec.output.json_schema) if spec.output is not None else None,
            max_output_retries=spec.output.max_retries if spec.output is not None else 2,
            temperature=spec.model.temperature,
            thinking=(
                Thinking(spec.model.thinking.budget_tokens, spec.model.thinking.interleaved)
                if spec.model.thinking is not None
                else None
            ),
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
            context=ContextConfig(
                clear_tool_results=spec.context.clear_tool_results.enabled,
                keep_tool_results=spec.context.clear_tool_results.keep_newest,
                clear_min_chars=spec.context.clear_tool_results.min_chars,
                clear_batch=spec.context.clear_tool_results.batch,
                compaction=spec.context.compaction.enabled,
                threshold_percent=spec.context.compaction.threshold_percent,
                keep_turns=spec.context.compaction.keep_newest_turns,
                clear_on_server=spec.context.clear_tool_results.strategy == "Server",
                compact_on_server=spec.context.compaction.strategy == "Server",
                window_tokens=(
                    spec.context.context_window_tokens
                    if spec.context.context_window_tokens is not None
                    else context_window_of(spec.model.name, context_windows)
                ),
            ),
        )
