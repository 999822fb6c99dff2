"""The mutable state of one run, and how it is rebuilt from a persisted transcript."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.loop.events import Progress
from agentrun.loop.protocols import Block, Message, Pricer
from agentrun.loop.usage import TokenUsage


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
