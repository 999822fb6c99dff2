"""The tool phase of a turn: the model's tool_use blocks become calls, their results one user turn.

Every tool_use id gets exactly one tool_result, even for calls that cannot run (unknown tool,
input cut off by maxTokens, denied, interrupted): the API rejects a conversation with an
unanswered call, and the model learns from the error what to do instead.
"""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal

from agentrun.api.stops import StopReason
from agentrun.api.traces import TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.loop.context import Context, Interrupted
from agentrun.loop.dispatching import ToolOutcome
from agentrun.loop.errors import ToolError
from agentrun.loop.events import ToolCallFinished, ToolCallRecovered, UsageAdopted
from agentrun.loop.judging import judge
from agentrun.loop.protocols import CallBudget, ToolCall
from agentrun.loop.state import RunState
from agentrun.loop.steps import Finish, Prepare, RunTools

REISSUE_HINT = "the call was cut off by the output token limit; reissue it with complete JSON input"


async def run_tools(step: RunTools, ctx: Context) -> Prepare | Finish:
    if step.recovered is not None:
        return await run_recovered(step, ctx)
    state, cfg = ctx.state, ctx.config
    calls, rejected = pending_calls(step, ctx)
    try:
        outcomes, denied = await ctx.guarded(ctx.gate.run(ctx.dispatcher, calls, rejected, ctx.gated(calls)))
    except Interrupted as exc:
        # Answer every id even now, so the stored transcript stays a valid conversation.
        note = "the run was cancelled" if exc.reason is StopReason.CANCELLED else "the run timed out"
        results = [
            {"type": "tool_result", "tool_use_id": c.id, "content": note, "is_error": True} for c in calls
        ]
        state.messages.append({"role": "user", "content": results})
        # The interrupted iteration still used tokens: its trace row is kept, with no tool calls.
        row, state.in_flight = state.in_flight, None
        await ctx.emit_checkpoint(row, tools_pending=False)
        raise
    executed = [
        o for o, c in zip(outcomes, calls, strict=True) if c.id not in rejected and c.id not in denied
    ]
    state.tool_calls += len(executed)
    for outcome in outcomes:
        await ctx.observer.notify(ToolCallFinished(state.iterations, outcome.trace))
        if outcome.trace.ok:
            state.succeeded_tools.add(outcome.trace.name)
    state.messages.append(ctx.user_message([o.block for o in outcomes]))
    await adopt_usage(ctx, outcomes)
    # The model answer's row was kept in the state (and in the checkpoint) before the tools ran,
    # so a resumed run (response None) completes the same row rather than inventing one.
    head = state.in_flight or TraceRow(state.iterations, "tool_use", (), TokenUsage(), cfg.model)
    state.in_flight = None
    trace = dataclasses.replace(head, tool_calls=tuple(o.trace for o in outcomes))
    # Judged before the checkpoint, so the checkpoint holds the counters this turn moved.
    verdict = await judge(ctx, outcomes, calls)
    remember(verdict, state)
    await ctx.emit_checkpoint(trace, tools_pending=False)
    return verdict


def pending_calls(step: RunTools, ctx: Context) -> tuple[list[ToolCall], dict[str, ToolError]]:
    """The calls of the pending tool_use blocks, and the error each one that cannot run gets instead:
    a call whose input maxTokens cut off (the last one of a truncated turn), or one naming no tool."""
    state, cfg = ctx.state, ctx.config
    blocks = state.pending_tool_uses()
    calls: list[ToolCall] = []
    rejected: dict[str, ToolError] = {}
    budget = call_budget(ctx, [str(b.get("name", "")) for b in blocks])
    for index, block in enumerate(blocks):
        raw_input = block.get("input")
        call = ToolCall(
            id=str(block["id"]),
            name=str(block.get("name", "")),
            input=raw_input if isinstance(raw_input, dict) else {},
            idempotency_key=f"{cfg.run_id}:{block['id']}",
            iteration=state.iterations,
            budget=budget,
        )
        calls.append(call)
        if step.truncated and index == len(blocks) - 1:
            rejected[call.id] = ToolError("truncated_input", "the tool input was cut off", hint=REISSUE_HINT)
        elif call.name not in ctx.tools:
            available = ", ".join(sorted(ctx.tools)) or "none"
            rejected[call.id] = ToolError(
                "unknown_tool",
                f"there is no tool named {call.name!r}",
                hint=f"available tools: {available}",
            )
    return calls, rejected


async def run_recovered(step: RunTools, ctx: Context) -> Prepare | Finish:
    assert step.recovered is not None and step.response is not None
    name, args = step.recovered
    state = ctx.state
    await ctx.observer.notify(ToolCallRecovered(state.iterations, name))
    call = ToolCall(
        id=f"text-{state.iterations}",
        name=name,
        input=args,
        idempotency_key=f"{ctx.config.run_id}:text-{state.iterations}",
        iteration=state.iterations,
    )
    state.messages.append({"role": "assistant", "content": step.response.content})
    await ctx.emit_checkpoint(None, tools_pending=False)
    # A call written as text needs the same approval as a real one: no way around the gate.
    outcomes, denied = await ctx.guarded(ctx.gate.run(ctx.dispatcher, [call], {}, ctx.gated([call])))
    outcome = outcomes[0]
    state.tool_calls += 0 if denied else 1
    await ctx.observer.notify(ToolCallFinished(state.iterations, outcome.trace))
    if outcome.trace.ok:
        state.succeeded_tools.add(name)
    await adopt_usage(ctx, outcomes)
    body = outcome.block["content"]
    done = "It was not approved, so it did not run" if denied else "It was run for you"
    note = (
        f"You wrote a call to {name} as text instead of using the tool interface. {done}; "
        f"{'error' if not outcome.trace.ok else 'result'}:\n{body}\nUse real tool calls from now on."
    )
    state.messages.append(ctx.user_message([{"type": "text", "text": note}]))
    trace = TraceRow(
        state.iterations,
        step.response.stop_reason,
        (outcome.trace,),
        step.response.usage,
        step.response.model,
        step.response.request_id,
    )
    verdict = await judge(ctx, outcomes, [call])
    remember(verdict, state)
    await ctx.emit_checkpoint(trace, tools_pending=False)
    return verdict


def call_budget(ctx: Context, names: list[str]) -> CallBudget:
    """What the run has left for this turn's calls; the calls that spawn runs share it.

    Only a call that spawns a run reads it (its child's limits are carved from it), so a turn without
    one gets the unlimited default instead of pricing the run's usage on every tool turn.
    """
    cfg, state = ctx.config, ctx.state
    siblings = sum(1 for n in names if n in ctx.tools and ctx.tools[n].definition.spawns_runs)
    if not siblings:
        return CallBudget()
    tokens = None if cfg.limits.token_budget is None else max(cfg.limits.token_budget - state.usage.total, 0)
    cost_usd = None
    if cfg.cost_budget_usd is not None:
        spent, _ = state.cost(ctx.pricer)
        cost_usd = max(cfg.cost_budget_usd - (spent or 0), Decimal(0))
    seconds = max(ctx.deadline - ctx.clock.monotonic(), 0.0)
    return CallBudget(tokens, cost_usd, None if math.isinf(seconds) else seconds, siblings)


async def adopt_usage(ctx: Context, outcomes: list[ToolOutcome]) -> None:
    """Usage spent by the calls elsewhere (child runs) becomes the run's, before the checkpoint that
    records the turn: the run's status, cost and budget checks include it from then on, and a
    resumed run never counts it twice (it is in the checkpointed state with the results)."""
    adopted: dict[str, TokenUsage] = {}
    for outcome in outcomes:
        for model, usage in outcome.usage_by_model.items():
            adopted[model] = adopted.get(model, TokenUsage()) + usage
    if not adopted:
        return
    state = ctx.state
    for model, usage in adopted.items():
        state.add_usage(model, usage)
    prices = [ctx.pricer.cost(model, usage) for model, usage in adopted.items()]
    cost = None if any(p is None for p in prices) else sum((p for p in prices if p is not None), Decimal(0))
    await ctx.observer.notify(UsageAdopted(state.iterations, adopted, cost))


def remember(verdict: Prepare | Finish, state: RunState) -> None:
    """A stop decided on this turn rides in its checkpoint, so a restart cannot lose it."""
    if isinstance(verdict, Finish):
        outcome = verdict.outcome
        state.verdict = {"stopReason": outcome.stop_reason.value, "message": outcome.message}
