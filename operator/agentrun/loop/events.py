"""Typed events the loop emits. Metrics, status and the transcript store are observers of these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.loop.stops import Outcome
from agentrun.loop.usage import TokenUsage


@dataclass(frozen=True)
class ToolTrace:
    tool_use_id: str
    name: str
    input_hash: str
    duration_seconds: float
    ok: bool
    error_code: str | None = None


@dataclass(frozen=True)
class TraceRow:
    """One row per model request: enough to debug a stuck run without reading the whole history."""

    iteration: int
    stop_reason: str | None
    tool_calls: tuple[ToolTrace, ...]
    usage: TokenUsage
    model: str
    request_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "stop_reason": self.stop_reason,
            "model": self.model,
            "request_id": self.request_id,
            "tool_calls": [
                {
                    "id": t.tool_use_id,
                    "name": t.name,
                    "input_hash": t.input_hash,
                    "ms": round(t.duration_seconds * 1000, 1),
                    "ok": t.ok,
                    **({"code": t.error_code} if t.error_code else {}),
                }
                for t in self.tool_calls
            ],
            **self.usage.as_dict(),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TraceRow:
        """The inverse of `as_dict`, for rows read back from a stored transcript."""
        return cls(
            iteration=int(raw["iteration"]),
            stop_reason=raw.get("stop_reason"),
            tool_calls=tuple(
                ToolTrace(
                    tool_use_id=str(t["id"]),
                    name=str(t["name"]),
                    input_hash=str(t.get("input_hash", "")),
                    duration_seconds=float(t.get("ms", 0.0)) / 1000,
                    ok=bool(t.get("ok")),
                    error_code=t.get("code"),
                )
                for t in raw.get("tool_calls") or []
            ),
            usage=TokenUsage.from_dict(dict(raw)),
            model=str(raw.get("model", "")),
            request_id=raw.get("request_id"),
        )


@dataclass(frozen=True)
class Progress:
    """Cumulative counters, carried by checkpoint events so observers need no state of their own."""

    iterations: int
    tool_calls: int
    usage: TokenUsage
    cost_usd: Decimal | None
    unpriced_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunStarted:
    resumed: bool
    progress: Progress


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
class RunFinished:
    outcome: Outcome
    progress: Progress


Event = (
    RunStarted
    | ModelRequestFinished
    | ModelRetryScheduled
    | ToolCallFinished
    | Checkpoint
    | LoopDetected
    | ToolCallRecovered
    | ApprovalRequested
    | ApprovalDecided
    | RunFinished
)
