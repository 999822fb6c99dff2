"""Everything the loop needs to know about one run, derived once from the AgentRun spec."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.api.context_spec import ContextSpec
from agentrun.api.model_names import claude_model
from agentrun.api.spec import AgentRunSpec, Limits
from agentrun.api.tool_specs import ToolChoice
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
    claude = claude_model(model)
    for entries in (table, CONTEXT_WINDOWS):
        for name in (model,) if claude == model else (model, claude):
            matching = [
                (len(pattern), not pattern.endswith("*"), tokens)
                for pattern, tokens in entries
                if (name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern)
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

    @classmethod
    def of(cls, context: ContextSpec, model: str, windows: Sequence[tuple[str, int]] = ()) -> ContextConfig:
        """spec.context, with the window of ``model`` (spec.context.contextWindowTokens, else known)."""
        clearing, compaction = context.clear_tool_results, context.compaction
        window = context.context_window_tokens
        return cls(
            clear_tool_results=clearing.enabled,
            keep_tool_results=clearing.keep_newest,
            clear_min_chars=clearing.min_chars,
            clear_batch=clearing.batch,
            compaction=compaction.enabled,
            threshold_percent=compaction.threshold_percent,
            keep_turns=compaction.keep_newest_turns,
            clear_on_server=clearing.strategy == "Server",
            compact_on_server=compaction.strategy == "Server",
            window_tokens=window if window is not None else context_window_of(model, windows),
        )

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
    """What the loop runs by. ``limits`` is the run's spec.limits as it is (with what the namespace's
    quotas set, controller/quotas/limits.py), read by the steps as the API declares it; the rest is
    derived from the spec where the loop needs another shape (the system prompt with the answer's
    instructions, the first request's tool choice, the context window)."""

    run_id: str
    task: str
    model: str
    max_tokens: int
    limits: Limits = field(default_factory=Limits)
    system: str | None = None
    temperature: float | None = None
    thinking: Thinking | None = None
    stop_sequences: tuple[str, ...] = ()
    finish_sequences: tuple[str, ...] = ()
    first_tool_choice: dict[str, Any] | None = None
    required_tools: tuple[str, ...] = ()
    # How long a call of a requiresApproval tool waits for a decision before it is denied:
    # limits.approvalTimeoutSeconds, else the operator's default.
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

    @property
    def cost_budget_usd(self) -> Decimal | None:
        """limits.costBudgetUSD as an exact amount, compared with exact spend."""
        budget = self.limits.cost_budget_usd
        return Decimal(str(budget)) if budget is not None else None

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
        model, output = spec.model, spec.output
        own_timeout = spec.limits.approval_timeout_seconds
        return cls(
            run_id=run_id,
            task=spec.task,
            model=model.name,
            max_tokens=model.max_tokens,
            limits=spec.limits,
            # The answer's schema goes into the system prompt: stable, so cached, and never
            # compacted away like an early user turn could be.
            system=(
                with_instructions(spec.system_prompt, output.json_schema) if output else spec.system_prompt
            ),
            output_schema=dict(output.json_schema) if output else None,
            max_output_retries=output.max_retries if output else 2,
            temperature=model.temperature,
            thinking=(
                Thinking(model.thinking.budget_tokens, model.thinking.interleaved) if model.thinking else None
            ),
            stop_sequences=tuple(model.stop_sequences),
            finish_sequences=tuple(model.finish_sequences),
            first_tool_choice=_first_tool_choice(spec.tool_choice),
            required_tools=tuple(spec.required_tools),
            approval_timeout_seconds=float(
                own_timeout if own_timeout is not None else approval_timeout_seconds
            ),
            retry=retry or RetryPolicy(),
            context=ContextConfig.of(spec.context, model.name, context_windows),
        )


def _first_tool_choice(choice: ToolChoice | None) -> dict[str, Any] | None:
    """spec.toolChoice as the first request sends it; None for auto (the API's own default)."""
    if choice is None or choice.type == "auto":
        return None
    return {"type": choice.type, **({"name": choice.name} if choice.name is not None else {})}
