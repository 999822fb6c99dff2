"""The verdict after a tool turn: go on, or stop a run that is failing or going in circles.

A model that keeps failing, or repeats the same call, spends budget without progress; these
checks stop it early with a reason that names the pattern, instead of at a budget much later.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.context import Context
from agentrun.loop.dispatching import ToolOutcome
from agentrun.loop.events import LoopDetected
from agentrun.loop.steps import Finish, Prepare


async def judge(ctx: Context, outcomes: Sequence[ToolOutcome]) -> Prepare | Finish:
    state, cfg = ctx.state, ctx.config
    fatal = next((o for o in outcomes if o.fatal), None)
    if fatal is not None:
        return Finish(
            Outcome(
                StopReason.FATAL_TOOL_ERROR,
                f"tool {fatal.trace.name} failed with a non-recoverable error ({fatal.trace.error_code})",
            )
        )
    if outcomes and all(not o.trace.ok for o in outcomes):
        state.consecutive_error_turns += 1
    else:
        state.consecutive_error_turns = 0
    if state.consecutive_error_turns >= cfg.max_consecutive_tool_errors:
        return Finish(
            Outcome(
                StopReason.TOO_MANY_TOOL_ERRORS,
                f"every tool call failed in {state.consecutive_error_turns} consecutive turns",
            )
        )
    if cfg.loop_detection:
        for outcome in outcomes:
            loop = detect_loop(ctx, outcome)
            if loop is not None:
                await ctx.observer.notify(LoopDetected(state.iterations, loop, outcome.trace.name))
                return Finish(Outcome(StopReason.LOOP_DETECTED, f"{loop} ({outcome.trace.name})"))
    return Prepare()


def detect_loop(ctx: Context, outcome: ToolOutcome) -> str | None:
    state, n = ctx.state, ctx.config.loop_repeats
    name = outcome.trace.name
    state.recent_calls.append((name, outcome.trace.input_hash))
    state.recent_results.append((name, outcome.result_hash))
    if outcome.trace.ok:
        state.failures_per_tool[name] = 0
    else:
        state.failures_per_tool[name] = state.failures_per_tool.get(name, 0) + 1
    for history, what in ((state.recent_calls, "input"), (state.recent_results, "result")):
        tail = list(history)[-n:]
        if len(tail) == n and len(set(tail)) == 1:
            return f"the same tool call with the same {what} repeated {n} times in a row"
    if state.failures_per_tool[name] >= ctx.config.loop_failures_per_tool:
        return f"the same tool failed {state.failures_per_tool[name]} times in a row with varying input"
    return None
