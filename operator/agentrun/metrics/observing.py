"""The per-run observer that feeds the operator's metrics (metrics/definitions.py) from loop events.

The `tool` label is a name the run declares (its RunStarted event lists them) or UNDECLARED_TOOL: a model
may call any name it invents, and each would otherwise become series of its own.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Protocol

from agentrun.api.traces import Progress
from agentrun.loop.events import (
    ApprovalDecided,
    ApprovalRequested,
    Checkpoint,
    ContextCompacted,
    Event,
    LoopDetected,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallRecovered,
    UsageAdopted,
)
from agentrun.metrics.definitions import Metrics

#: The `tool` label of every call (and loop) of a name the run does not declare. Tool names are
#: `[a-zA-Z0-9_-]{1,64}`, so no declared tool can be called this.
UNDECLARED_TOOL = "(undeclared)"


class Monotonic(Protocol):
    def monotonic(self) -> float: ...


class MetricsObserver:
    """Per-run adapter from loop events to the shared metrics; keeps only what a delta needs."""

    def __init__(
        self, metrics: Metrics, *, namespace: str, started_monotonic: float, clock: Monotonic | None = None
    ) -> None:
        self._m = metrics
        self._namespace = namespace
        self._started = started_monotonic
        self._clock = clock
        self._cost_seen = Decimal(0)
        self._approvals_pending = 0
        self._tools: frozenset[str] = frozenset()

    def _tool(self, name: str) -> str:
        """``name`` if the run declares it, else the one bucket of every invented name."""
        return name if name in self._tools else UNDECLARED_TOOL

    def _count_cost(self, progress: Progress) -> None:
        """Spend is counted per priced response, so a cost-burn alert sees a long run burning."""
        if progress.cost_usd is None:
            return
        delta = progress.cost_usd - self._cost_seen
        if delta > 0:
            self._m.series(self._m.cost, self._namespace).inc(float(delta))
            self._cost_seen = progress.cost_usd

    def approval_requested(self) -> None:
        self._approvals_pending += 1
        self._m.approvals_pending.inc()

    def approval_decided(self) -> None:
        if self._approvals_pending > 0:
            self._approvals_pending -= 1
            self._m.approvals_pending.dec()

    async def notify(self, event: Event) -> None:
        m, ns = self._m, self._namespace
        match event:
            case RunStarted(resumed=resumed, progress=progress, tools=tools):
                self._tools = frozenset(tools)
                m.runs_started.labels(ns, str(resumed).lower()).inc()
                # A resumed run was already counted up to its checkpoint by an earlier process.
                self._cost_seen = progress.cost_usd or Decimal(0)
            case ModelRequestFinished(model=model, duration_seconds=seconds, outcome=outcome, usage=usage):
                m.series(m.model_requests, model, outcome).inc()
                m.series(m.model_duration, model).observe(seconds)
                for kind, value in (
                    ("input", usage.input_tokens),
                    ("output", usage.output_tokens),
                    ("cache_read", usage.cache_read_input_tokens),
                    ("cache_write", usage.cache_creation_input_tokens),
                ):
                    if value:
                        m.series(m.tokens, ns, model, kind).inc(value)
                prompt = (
                    usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
                )
                if prompt:
                    m.series(m.prompt_tokens, ns, model).inc(prompt)
                    m.series(m.prompt_cached_tokens, ns, model).inc(usage.cache_read_input_tokens)
            case UsageAdopted(cost_usd=adopted):
                # Child runs' spend: their own observers counted it; the parent's cost only carries it.
                self._cost_seen += adopted or Decimal(0)
            case Checkpoint(progress=progress):
                self._count_cost(progress)
            case ModelRetryScheduled(retry_class=retry_class):
                m.model_retries.labels(retry_class).inc()
            case ToolCallFinished(trace=trace):
                tool = self._tool(trace.name)
                m.series(m.tool_calls, tool, "ok" if trace.ok else (trace.error_code or "error")).inc()
                m.series(m.tool_duration, tool).observe(trace.duration_seconds)
            case ApprovalRequested():
                self.approval_requested()
            case ApprovalDecided(approved=approved, timed_out=timed_out):
                decision = "timed_out" if timed_out else ("approved" if approved else "denied")
                m.approvals_decided.labels(decision).inc()
                self.approval_decided()
            case LoopDetected(tool_name=tool):
                m.loop_detections.labels(self._tool(tool)).inc()
            case ContextCompacted(tokens_before=before, tokens_after=after):
                m.compactions.inc()
                m.compaction_tokens_removed.inc(max(before - after, 0))
            case ToolCallRecovered(tool_name=tool):
                m.recovered_calls.labels(self._tool(tool)).inc()
            case RunFinished(outcome=outcome, progress=progress):
                self._count_cost(progress)
                m.run_finished(ns, outcome.stop_reason)
                m.iterations.labels(ns).observe(progress.iterations)
                if self._clock is not None:
                    self.finished(self._clock.monotonic())
                self.release_approvals()
            case _:
                pass

    def release_approvals(self) -> None:
        """A run that ends (or stops in this process) no longer waits for anyone."""
        while self._approvals_pending:
            self.approval_decided()

    def finished(self, now_monotonic: float) -> None:
        self._m.run_duration.labels(self._namespace).observe(max(0.0, now_monotonic - self._started))
