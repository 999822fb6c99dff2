"""Trace rows and cumulative counters: what every iteration leaves in the transcript.

They live in the API layer because they are a stored format: the loop produces them, the transcript
store persists them, and `kubectl agentrun trace` reads them back without the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentrun.api.usage import TokenUsage

#: The stop_reason column of a summary request's trace row (context compaction), which is no iteration.
COMPACTION = "compaction"


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
    #: How long the model took to answer this request (the answering attempt); None when not measured
    #: (a transcript written before it was, a summary request). With the tools' durations, the run's
    #: time request by request (the console's timeline).
    model_seconds: float | None = None

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
            **({"model_ms": round(self.model_seconds * 1000, 1)} if self.model_seconds is not None else {}),
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
            model_seconds=float(raw["model_ms"]) / 1000 if raw.get("model_ms") is not None else None,
        )


@dataclass(frozen=True)
class Progress:
    """Cumulative counters, carried by checkpoint events so observers need no state of their own."""

    iterations: int
    tool_calls: int
    usage: TokenUsage
    cost_usd: Decimal | None
    unpriced_models: tuple[str, ...] = ()
