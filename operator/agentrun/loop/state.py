"""The mutable state of one run, and how it is rebuilt from a persisted transcript."""

from __future__ import annotations

import hashlib
import json
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


#: The longest cycle of whole tool turns loop detection looks for (A, B, C, D, A, B, C, D).
MAX_CYCLE = 4


@dataclass
class LoopWatch:
    """What loop detection remembers between tool turns: streak counters, not the turns themselves.

    Counters keep every checkpoint small whatever `repeats` is, and a restored watch continues
    each streak where the interrupted run left it, so a resumed run stops at the same turn.
    """

    # (tool, input hash) of each call of the last tool turn -> tool turns in a row that made it
    call_streaks: dict[tuple[str, str], int] = field(default_factory=dict)
    # (signature of every call and result, label for the stop message) of the last MAX_CYCLE turns
    turns: list[tuple[str, str]] = field(default_factory=list)
    # per period p (index p - 1): tool turns in a row equal to the turn p before them
    cycle_runs: list[int] = field(default_factory=lambda: [0] * MAX_CYCLE)
    # tool -> tool turns in a row in which every call of that tool failed
    failure_streaks: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": [[name, digest, n] for (name, digest), n in self.call_streaks.items()],
            "turns": [list(turn) for turn in self.turns],
            "cycles": list(self.cycle_runs),
            "failures": dict(self.failure_streaks),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> LoopWatch:
        """Absent keys (a transcript written before this format) start the streaks afresh."""
        cycles = [int(n) for n in raw.get("cycles") or []][:MAX_CYCLE]
        return cls(
            call_streaks={(str(a), str(b)): int(n) for a, b, n in raw.get("calls") or []},
            turns=[(str(a), str(b)) for a, b in raw.get("turns") or []][-MAX_CYCLE:],
            cycle_runs=cycles + [0] * (MAX_CYCLE - len(cycles)),
            failure_streaks={str(k): int(v) for k, v in (raw.get("failures") or {}).items()},
        )


@dataclass(frozen=True)
class Compaction:
    """The latest compaction: what is sent instead of `messages[:boundary]` (the task stays first).

    Kept in every checkpoint, so a resumed run sends the same compacted view without asking for
    the summary again; the messages themselves are never changed.
    """

    summary: str
    boundary: int  # index of the first message sent whole: always an assistant message
    turns: int  # assistant messages the summary stands for (all of them before the boundary)
    tokens_before: int
    tokens_after: int
    iteration: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "boundary": self.boundary,
            "turns": self.turns,
            "tokensBefore": self.tokens_before,
            "tokensAfter": self.tokens_after,
            "iteration": self.iteration,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Compaction:
        return cls(
            summary=str(raw.get("summary", "")),
            boundary=int(raw.get("boundary", 0)),
            turns=int(raw.get("turns", 0)),
            tokens_before=int(raw.get("tokensBefore", 0)),
            tokens_after=int(raw.get("tokensAfter", 0)),
            iteration=int(raw.get("iteration", 0)),
        )


def text_of(blocks: Iterable[Block]) -> str:
    """All text blocks joined: the model may split one answer over several blocks."""
    return "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")


def tool_uses(blocks: Iterable[Block]) -> list[Block]:
    return [b for b in blocks if b.get("type") == "tool_use"]


@dataclass(frozen=True)
class SentView:
    """The messages a request sends, derived from `count` messages ending with `last`."""

    count: int
    last: Message | None
    compaction: Compaction | None
    config: object
    messages: list[Message]


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
    output_retries: int = 0
    final_turn: bool = False
    text_parts: list[str] = field(default_factory=list)
    succeeded_tools: set[str] = field(default_factory=set)
    loop_watch: LoopWatch = field(default_factory=LoopWatch)
    # The trace row (without tool calls) of the model answer whose tools are running: a resumed run
    # finishes that row from here instead of inventing one.
    in_flight: TraceRow | None = None
    # A stop decided after a tool turn, checkpointed with that turn: a run resumed from the
    # checkpoint stops right there, as the uninterrupted run did (stopReason, message).
    verdict: dict[str, str] | None = None
    # Context management: the latest compaction, how many there were and the tokens they removed,
    # and the size of the last request (its reported input tokens and the characters of its
    # messages), which the next request's size is estimated from.
    compaction: Compaction | None = None
    compactions: int = 0
    context_tokens_removed: int = 0
    last_input_tokens: int | None = None
    last_sent_chars: int = 0
    # One small entry per compaction (iteration, turns, tokens before and after), for the trace.
    compaction_log: list[dict[str, int]] = field(default_factory=list)
    # Characters of each stored message as JSON, by identity (windowing.view_chars): sizes are
    # estimated before every request, and a stored message never changes, so each is measured once.
    # The message itself is kept beside its size, so an id is never reused while it is cached.
    measured: dict[int, tuple[Message, int]] = field(default_factory=dict, repr=False, compare=False)
    # The last view derived for a request (windowing.sent_messages) and what it was derived from.
    view: SentView | None = field(default=None, repr=False, compare=False)

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

    def snapshot(self) -> dict[str, Any]:
        """Everything besides the messages that a resumed run needs; small and JSON-ready."""
        return {
            "iterations": self.iterations,
            "toolCalls": self.tool_calls,
            "usageByModel": {model: u.as_dict() for model, u in sorted(self.usage_by_model.items())},
            "consecutiveErrorTurns": self.consecutive_error_turns,
            "continuations": self.continuations,
            "reissues": self.reissues,
            "driftReprompts": self.drift_reprompts,
            "deliverableNudges": self.deliverable_nudges,
            "outputRetries": self.output_retries,
            "finalTurn": self.final_turn,
            "textParts": list(self.text_parts),
            "succeededTools": sorted(self.succeeded_tools),
            "loopWatch": self.loop_watch.as_dict(),
            "inFlight": self.in_flight.as_dict() if self.in_flight is not None else None,
            "verdict": dict(self.verdict) if self.verdict is not None else None,
            "context": {
                "compaction": self.compaction.as_dict() if self.compaction is not None else None,
                "compactions": self.compactions,
                "tokensRemoved": self.context_tokens_removed,
                "lastInputTokens": self.last_input_tokens,
                "lastSentChars": self.last_sent_chars,
                "log": [dict(entry) for entry in self.compaction_log],
            },
        }

    @classmethod
    def restore(cls, messages: Sequence[Message], snapshot: Mapping[str, Any]) -> RunState:
        """The state a run had at its last persisted checkpoint (see `snapshot`)."""
        usage = snapshot.get("usageByModel") or {}
        in_flight = snapshot.get("inFlight")
        context = snapshot.get("context") or {}
        compaction = context.get("compaction")
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
            output_retries=int(snapshot.get("outputRetries", 0)),
            final_turn=bool(snapshot.get("finalTurn", False)),
            text_parts=[str(t) for t in snapshot.get("textParts") or []],
            succeeded_tools={str(t) for t in snapshot.get("succeededTools") or []},
            loop_watch=LoopWatch.from_dict(snapshot.get("loopWatch") or {}),
            in_flight=TraceRow.from_dict(in_flight) if in_flight else None,
            verdict=_verdict(snapshot.get("verdict")),
            compaction=Compaction.from_dict(compaction) if compaction else None,
            compactions=int(context.get("compactions", 0)),
            context_tokens_removed=int(context.get("tokensRemoved", 0)),
            last_input_tokens=(
                int(context["lastInputTokens"]) if context.get("lastInputTokens") is not None else None
            ),
            last_sent_chars=int(context.get("lastSentChars", 0)),
            compaction_log=[{str(k): int(v) for k, v in entry.items()} for entry in context.get("log") or []],
        )


def _verdict(raw: Any) -> dict[str, str] | None:
    """A checkpointed stop, or None (also for transcripts written before verdicts were kept)."""
    if not isinstance(raw, Mapping) or "stopReason" not in raw:
        return None
    return {"stopReason": str(raw["stopReason"]), "message": str(raw.get("message", ""))}
