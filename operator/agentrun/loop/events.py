"""Typed events the loop emits. Metrics, status and the transcript store are observers of these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.api.stops import Outcome
from agentrun.api.traces import Progress, ToolTrace, TraceRow
from agentrun.api.usage import TokenUsage


@dataclass(frozen=True)
class RunStarted:
    resumed: bool
    progress: Progress
    # The names of the run's tools, the ones the model may call (sorted). Any other name the model
    # writes is one it invented: observers that label by tool name fold those into one value.
    tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelRequestFinished:
    iteration: int
    model: str
    duration_seconds: float
    outcome: str  # "ok", a RetryClass value, or "error"
    usage: TokenUsage = field(default_factory=TokenUsage)
    stop_reason: str | None = None  # the response's stop_reason when outcome is "ok" (for traces)


@dataclass(frozen=True)
class ModelRetryScheduled:
    iteration: int
    retry_class: str
    attempt: int
    delay_seconds: float
    message: str


@dataclass(frozen=True)
class ToolCallFinished:
    iteration: int
    trace: ToolTrace


@dataclass(frozen=True)
class Checkpoint:
    """Durable progress: the messages appended since the previous checkpoint, and the trace row.

    Emitted twice per tool turn: once after the model answered (so a restart re-runs the same
    tool_use ids) and once after the tool results are in. Observers persist before the loop goes on.
    """

    iteration: int
    new_messages: Sequence[dict[str, Any]]
    message_count: int
    trace: TraceRow | None
    progress: Progress
    tools_pending: bool
    # RunState.snapshot(): the counters a resumed run needs besides the messages (small, JSON-ready).
    state: Mapping[str, Any] = field(default_factory=dict)
    # Written at once, whatever the store would defer: a compaction's summary cost a request.
    durable: bool = False


@dataclass(frozen=True)
class ContextCompacted:
    """The turns before `boundary` are sent as a summary from now on; the transcript keeps them."""

    iteration: int
    compactions: int  # of the run so far, this one included
    tokens_before: int  # estimated input tokens of the next request without compaction
    tokens_after: int  # estimated input tokens of the next request with it
    turns: int  # model turns the summary stands for
    usage: TokenUsage  # of the summary request
    tokens_removed: int = 0  # by every compaction of the run so far
    refused: bool = False  # the API had refused the request as too long


@dataclass(frozen=True)
class LoopDetected:
    iteration: int
    pattern: str
    tool_name: str


@dataclass(frozen=True)
class ToolCallRecovered:
    """A tool call the model wrote as text, turned into a real call."""

    iteration: int
    tool_name: str


@dataclass(frozen=True)
class ApprovalRequested:
    """A call of a tool with requiresApproval waits for a human; listed in status until decided."""

    iteration: int
    tool_use_id: str
    tool_name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class ApprovalDecided:
    """A decision on a call: from spec.approvals, a recorded one after a restart, or the timeout."""

    iteration: int
    tool_use_id: str
    tool_name: str
    approved: bool
    by: str | None
    reason: str | None
    timed_out: bool
    waited_seconds: float


@dataclass(frozen=True)
class UsageAdopted:
    """Usage tool calls spent elsewhere (child runs) was added to the run's own: its cost is in
    the next Progress, yet the model requests were already counted where they were made."""

    iteration: int
    usage_by_model: Mapping[str, TokenUsage]
    cost_usd: Decimal | None  # None: some model of it has no price


@dataclass(frozen=True)
class RunFinished:
    outcome: Outcome
    progress: Progress


@dataclass(frozen=True)
class RunYielded:
    """The run stopped at a checkpoint for another replica to resume (`yield_at_checkpoint`): it did
    not end, so nothing terminal follows; what a writer still holds back must be written now."""

    progress: Progress


Event = (
    RunStarted
    | ModelRequestFinished
    | ModelRetryScheduled
    | ToolCallFinished
    | Checkpoint
    | ContextCompacted
    | LoopDetected
    | ToolCallRecovered
    | ApprovalRequested
    | ApprovalDecided
    | UsageAdopted
    | RunFinished
    | RunYielded
)
