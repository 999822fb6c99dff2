"""The mutable state of one run, and how it is rebuilt from a persisted transcript."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.api.traces import Progress, TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.loop.protocols import Block, Message, Pricer


def content_hash(value: Any) -> str:
    """A short stable hash: enough to spot repeats without storing whole inputs in the trace."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def text_of(blocks: Iterable[Block]) -> str:
    """All text blocks joined: the model may split one answer over several blocks."""
    return "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")


def tool_uses(blocks: Iterable[Block]) -> list[Block]:
    return [b for b in blocks if b.get("type") == "tool_use"]


@dataclass
class RunState:
    messages: list[Message]
    iterations: int = 0
    tool_calls: int = 0
    usage_by_model: dict[str, TokenUsage] = field(default_factory=dict)
    persisted: int = 0
    consecutive_error_turns: int = 0
    continuations: int = 0
    reissues: int = 0
    drift_reprompts: int = 0
    deliverable_nudges: int = 0
    final_turn: bool = False
    text_parts: list[str] = field(default_factory=list)
    succeeded_tools: set[str] = field(default_factory=set)
    recent_calls: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=100))
    recent_results: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=100))
    failures_per_tool: dict[str, int] = field(default_factory=dict)
    # The trace row (without tool calls) of the model answer whose tools are running: a resumed run
    # finishes that row from here instead of inventing one.
    in_flight: TraceRow | None = None

    @classmethod
    def fresh(cls, task: str) -> RunState:
        return cls(messages=[{"role": "user", "content": [{"type": "text", "text": task}]}])

    @property
    def usage(self) -> TokenUsage:
        total = TokenUsage()
        for usage in self.usage_by_model.values():
            total = total + usage
        return total

    def add_usage(self, model: str, usage: TokenUsage) -> None:
        self.usage_by_model[model] = self.usage_by_model.get(model, TokenUsage()) + usage

    def cost(self, pricer: Pricer) -> tuple[Decimal | None, tuple[str, ...]]:
        """Total spend, or None if any used model is unpriced (a partial sum would understate it)."""
        total = Decimal(0)
        unpriced: list[str] = []
        for model, usage in sorted(self.usage_by_model.items()):
            price = pricer.cost(model, usage)
            if price is None:
                unpriced.append(model)
            else:
                total += price
        return (None if unpriced else total), tuple(unpriced)

    def progress(self, pricer: Pricer) -> Progress:
        cost, unpriced = self.cost(pricer)
        return Progress(self.iterations, self.tool_calls, self.usage, cost, unpriced)

    def unpersisted(self) -> Sequence[Message]:
        return self.messages[self.persisted :]

    def pending_tool_uses(self) -> list[Block]:
        """tool_use blocks of a trailing assistant message that have no results yet (resume case)."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return []
        return tool_uses(self.messages[-1]["content"])

    def snapshot(self, history: int) -> dict[str, Any]:
        """Everything besides the messages that a resumed run needs; small and JSON-ready.

        `history` bounds the loop-detection windows kept: only the last `loop_repeats` entries
        are ever compared, so storing more would only make every checkpoint bigger.
        """
        keep = max(history, 1)
        return {
            "iterations": self.iterations,
            "toolCalls": self.tool_calls,
            "usageByModel": {model: u.as_dict() for model, u in sorted(self.usage_by_model.items())},
            "consecutiveErrorTurns": self.consecutive_error_turns,
            "continuations": self.continuations,
            "reissues": self.reissues,
            "driftReprompts": self.drift_reprompts,
            "deliverableNudges": self.deliverable_nudges,
            "finalTurn": self.final_turn,
            "textParts": list(self.text_parts),
            "succeededTools": sorted(self.succeeded_tools),
            "recentCalls": [list(c) for c in list(self.recent_calls)[-keep:]],
            "recentResults": [list(r) for r in list(self.recent_results)[-keep:]],
            "failuresPerTool": dict(self.failures_per_tool),
            "inFlight": self.in_flight.as_dict() if self.in_flight is not None else None,
        }

    @classmethod
    def restore(cls, messages: Sequence[Message], snapshot: Mapping[str, Any]) -> RunState:
        """The state a run had at its last persisted checkpoint (see `snapshot`)."""
        usage = snapshot.get("usageByModel") or {}
        in_flight = snapshot.get("inFlight")
        return cls(
            messages=[dict(m) for m in messages],
            iterations=int(snapshot.get("iterations", 0)),
            tool_calls=int(snapshot.get("toolCalls", 0)),
            usage_by_model={str(m): TokenUsage.from_dict(dict(u)) for m, u in usage.items()},
            persisted=len(messages),
            consecutive_error_turns=int(snapshot.get("consecutiveErrorTurns", 0)),
            continuations=int(snapshot.get("continuations", 0)),
            reissues=int(snapshot.get("reissues", 0)),
            drift_reprompts=int(snapshot.get("driftReprompts", 0)),
            deliverable_nudges=int(snapshot.get("deliverableNudges", 0)),
            final_turn=bool(snapshot.get("finalTurn", False)),
            text_parts=[str(t) for t in snapshot.get("textParts") or []],
            succeeded_tools={str(t) for t in snapshot.get("succeededTools") or []},
            recent_calls=deque(((str(a), str(b)) for a, b in snapshot.get("recentCalls") or []), maxlen=100),
            recent_results=deque(
                ((str(a), str(b)) for a, b in snapshot.get("recentResults") or []), maxlen=100
            ),
            failures_per_tool={str(k): int(v) for k, v in (snapshot.get("failuresPerTool") or {}).items()},
            in_flight=TraceRow.from_dict(in_flight) if in_flight else None,
        )
