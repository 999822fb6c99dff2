"""The verdict after a tool turn: go on, or stop a run that is failing or going in circles.

A model that keeps failing, or keeps doing what it already did, spends budget without progress;
these checks stop it early with a reason that names the pattern, instead of at a budget much later.

A loop is no progress across tool turns, never something seen within one turn: parallel calls
that get equal answers (three teams notified, three pods with empty logs, three lookups that say
"not found") are different questions, and so are equal answers to different calls in later turns.
What counts, with `repeats` tool turns in a row as the threshold:

* the same call (tool and input, as canonical JSON) made in every one of those turns;
* the same whole turn (every call and its result) repeated;
* a cycle of up to `MAX_CYCLE` whole turns (A, B, A, B or A, B, C, A, B, C) gone round at least
  twice, over at least `repeats` turns;
* and, counted apart with `failures_per_tool`, one tool failing in turn after turn whatever its input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.context import Context
from agentrun.loop.dispatching import ToolOutcome
from agentrun.loop.events import LoopDetected
from agentrun.loop.protocols import ToolCall
from agentrun.loop.state import MAX_CYCLE, LoopWatch, content_hash
from agentrun.loop.steps import Finish, Prepare

#: Bounds on how a turn is described in the stop message (and kept for it in every checkpoint).
INPUT_CHARS = 60
CALLS_NAMED = 3


@dataclass(frozen=True)
class Loop:
    """A detected loop: what the stop message and the LoopDetected event say."""

    message: str
    tool: str


async def judge(ctx: Context, outcomes: Sequence[ToolOutcome], calls: Sequence[ToolCall]) -> Prepare | Finish:
    """Update the run's counters with this turn and decide; the caller checkpoints them after.

    The counters change here, before the turn's checkpoint, so a run resumed from that checkpoint
    continues every streak exactly where the interrupted run left it.
    """
    state, cfg = ctx.state, ctx.config
    fatal = next((o for o in outcomes if o.fatal), None)
    if fatal is not None:
        return Finish(
            Outcome(
                StopReason.FATAL_TOOL_ERROR,
                f"tool {fatal.trace.name} failed with a non-recoverable error ({fatal.trace.error_code})"
                + (f": {fatal.fatal_message}" if fatal.fatal_message else ""),
            )
        )
    if outcomes and all(not o.trace.ok for o in outcomes):
        state.consecutive_error_turns += 1
    else:
        state.consecutive_error_turns = 0
    if state.consecutive_error_turns >= cfg.limits.max_consecutive_tool_errors:
        return Finish(
            Outcome(
                StopReason.TOO_MANY_TOOL_ERRORS,
                f"every tool call failed in {state.consecutive_error_turns} consecutive turns",
            )
        )
    if cfg.limits.loop_detection.enabled and outcomes:
        described = describe(outcomes, {c.id: c.input for c in calls})
        watch_turn(state.loop_watch, outcomes, label_of(described))
        loop = find_loop(
            state.loop_watch,
            described,
            cfg.limits.loop_detection.repeats,
            cfg.limits.loop_detection.failures_per_tool,
        )
        if loop is not None:
            await ctx.observer.notify(LoopDetected(state.iterations, loop.message, loop.tool))
            return Finish(Outcome(StopReason.LOOP_DETECTED, loop.message))
    return Prepare()


def watch_turn(watch: LoopWatch, outcomes: Sequence[ToolOutcome], label: str) -> None:
    """Advance every streak by one tool turn; a streak this turn does not continue starts over."""
    calls = [(o.trace.name, o.trace.input_hash) for o in outcomes]
    watch.call_streaks = {call: watch.call_streaks.get(call, 0) + 1 for call in dict.fromkeys(calls)}
    # Order-free: the same calls answered alike are the same turn, whichever the model listed first.
    signature = content_hash(
        sorted([o.trace.name, o.trace.input_hash, o.trace.ok, o.result_hash] for o in outcomes)
    )
    for period in range(1, MAX_CYCLE + 1):
        before = watch.turns[-period][0] if len(watch.turns) >= period else None
        runs = watch.cycle_runs[period - 1]
        watch.cycle_runs[period - 1] = runs + 1 if before == signature else 0
    watch.turns = [*watch.turns, (signature, label)][-MAX_CYCLE:]
    failing: dict[str, bool] = {}
    for outcome in outcomes:
        failing[outcome.trace.name] = failing.get(outcome.trace.name, True) and not outcome.trace.ok
    for name, failed in failing.items():
        watch.failure_streaks[name] = watch.failure_streaks.get(name, 0) + 1 if failed else 0


def find_loop(
    watch: LoopWatch, described: Mapping[tuple[str, str], str], repeats: int, failures_per_tool: int
) -> Loop | None:
    """The most specific loop the streaks show, after `watch_turn` of the turn `described`.

    A repeated turn or cycle is named before a repeated call: it says everything the run repeats.
    """
    if not watch.turns or not described:
        return None
    first_tool = next(iter(described))[0]
    for period in range(1, MAX_CYCLE + 1):
        span = watch.cycle_runs[period - 1] + period  # the turns that repeat with this period
        if span < max(2 * period, repeats):
            continue
        if period == 1:
            return Loop(
                f"the same iteration (every call and result) repeated {span} times "
                f"in a row: {watch.turns[-1][1]}",
                first_tool,
            )
        cycle = " -> ".join(f"[{label}]" for _, label in watch.turns[-period:])
        return Loop(
            f"a cycle of {period} iterations repeated over the last {span} iterations: {cycle}",
            first_tool,
        )
    call = max(described, key=lambda c: watch.call_streaks.get(c, 0))
    streak = watch.call_streaks.get(call, 0)
    if streak >= repeats:
        return Loop(
            f"the same call in {streak} iterations in a row: {described.get(call, call[0])}",
            call[0],
        )
    for tool in dict.fromkeys(name for name, _ in described):
        failed = watch.failure_streaks.get(tool, 0)
        if failed >= failures_per_tool:
            return Loop(
                f"every call of tool {tool} failed in {failed} iterations in a row, whatever its input",
                tool,
            )
    return None


def describe(outcomes: Sequence[ToolOutcome], inputs: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """Each distinct call of a turn, in call order, as its tool and the start of its input."""
    described: dict[tuple[str, str], str] = {}
    for outcome in outcomes:
        raw = json.dumps(
            inputs.get(outcome.trace.tool_use_id, {}), sort_keys=True, separators=(",", ":"), default=str
        )
        shown = raw if len(raw) <= INPUT_CHARS else f"{raw[:INPUT_CHARS]}..."
        described.setdefault((outcome.trace.name, outcome.trace.input_hash), f"{outcome.trace.name} {shown}")
    return described


def label_of(described: Mapping[tuple[str, str], str]) -> str:
    """A turn in the stop message, bounded: it is kept for the last turns in every checkpoint."""
    parts = list(described.values())
    shown = parts[:CALLS_NAMED]
    if len(parts) > CALLS_NAMED:
        shown.append(f"and {len(parts) - CALLS_NAMED} more calls")
    return "; ".join(shown)
