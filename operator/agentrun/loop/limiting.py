"""The limits of a run, checked before every model request rather than after.

Checked up front, a budget or the deadline stops the run before it spends more; checked after an
answer, the last request would already have gone over. The iteration limit is the exception that
still asks once more: the run gets one answer turn without tools, so it ends with a result.
"""

from __future__ import annotations

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.usage import TokenUsage
from agentrun.loop.context import Context
from agentrun.loop.steps import CallModel, Compact, Finish
from agentrun.loop.windowing import estimate, fixed_chars, plan_cut, sent_messages


async def prepare(ctx: Context) -> CallModel | Compact | Finish:
    cfg, state = ctx.config, ctx.state
    if state.verdict is not None:
        # Resumed from the checkpoint of the turn that decided the stop: it stands.
        return Finish(Outcome(StopReason(state.verdict["stopReason"]), state.verdict["message"]))
    if ctx.cancel.is_set():
        return Finish(Outcome(StopReason.CANCELLED, "spec.cancel was set"))
    if ctx.clock.monotonic() >= ctx.deadline:
        return Finish(Outcome(StopReason.TIMEOUT, f"timeoutSeconds={cfg.limits.timeout_seconds:g} reached"))
    if cfg.limits.token_budget is not None and state.usage.total >= cfg.limits.token_budget:
        return Finish(
            Outcome(
                StopReason.TOKEN_BUDGET_EXCEEDED,
                f"used {state.usage.total} of tokenBudget {cfg.limits.token_budget} tokens",
            )
        )
    if cfg.cost_budget_usd is not None:
        cost, unpriced = state.cost(ctx.pricer)
        if ctx.pricer.cost(cfg.model, TokenUsage()) is None and cfg.model not in unpriced:
            unpriced = (cfg.model, *unpriced)
        if unpriced:
            return Finish(
                Outcome(
                    StopReason.INVALID_SPEC,
                    f"costBudgetUSD is set but model(s) {', '.join(unpriced)} have no price in the "
                    "operator's price table; add a price (see docs/operating.md, 'Prices') "
                    "or drop the budget",
                )
            )
        if cost is not None and cost >= cfg.cost_budget_usd:
            return Finish(
                Outcome(
                    StopReason.COST_BUDGET_EXCEEDED,
                    f"spent ${cost:.6f} of costBudgetUSD ${cfg.cost_budget_usd}",
                )
            )
    crowded = crowding(ctx)
    if crowded is not None:
        return crowded
    if state.iterations >= cfg.limits.max_iterations:
        if state.final_turn:
            return Finish(
                Outcome(
                    StopReason.MAX_ITERATIONS,
                    f"maxIterations={cfg.limits.max_iterations} reached; final answer turn also used",
                )
            )
        return CallModel(final=True)
    return CallModel(final=False)


def crowding(ctx: Context) -> Compact | None:
    """Compaction when the next request would reach the threshold, at most once per model turn.

    Checked after the budgets, so a summary request is never sent past one either. When nothing
    can be compacted (no turn left to summarize, or compacted since the last turn), the request
    goes out anyway: the estimate may be wrong, and the API's refusal says so if it is not.
    """
    cfg, state = ctx.config.context, ctx.state
    threshold = cfg.threshold_tokens
    if threshold is None:
        return None
    if state.compaction is not None and state.compaction.iteration >= state.iterations:
        return None
    if plan_cut(state, cfg.keep_turns) is None:
        return None
    tools = [tool.definition for tool in ctx.tools.values()]
    tokens = estimate(state, sent_messages(state, cfg), fixed_chars(ctx.config.system, tools))
    return Compact(tokens) if tokens >= threshold else None
