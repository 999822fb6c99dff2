"""Compaction: the model summarizes the older turns, and the summary is sent in their place.

The summary request is a model request of its own: tools stay declared (the conversation holds
tool_use blocks, and the cached prefix stays the same) but switched off with tool_choice none, and
thinking is off. Its tokens are the run's usage, so they count in tokenBudget and costBudgetUSD,
which `limiting` checked before it led here and checks again before the next request; it is not
an iteration (maxIterations counts the requests that may call tools).

What is stored never changes: the summary, where it cuts and what it saved go into the state, and
a durable checkpoint persists them before the run goes on, so a resumed run sends the same view
without asking for the summary again.
"""

from __future__ import annotations

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import COMPACTION, TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.loop.context import Context
from agentrun.loop.errors import FatalModelError
from agentrun.loop.events import ModelRequestFinished
from agentrun.loop.protocols import ModelRequest, ModelResponse
from agentrun.loop.sending import Answered, send_with_retries, unanswered
from agentrun.loop.state import Compaction, text_of
from agentrun.loop.steps import Compact, Finish, Prepare
from agentrun.loop.windowing import (
    estimate,
    fixed_chars,
    plan_cut,
    sent_messages,
    summary_messages,
    summary_server_edits,
)


def cannot(reason: str, api_message: str | None = None) -> Finish:
    why = f"context management could not make room: {reason}"
    message = f"{api_message} ({why})" if api_message else why
    return Finish(Outcome(StopReason.CONTEXT_WINDOW_EXCEEDED, message))


async def compact(step: Compact, ctx: Context) -> Prepare | Finish:
    cfg, state = ctx.config, ctx.state
    cut = plan_cut(state, cfg.context.keep_turns)
    if cut is None:
        size = f"needs about {step.estimated_tokens} tokens" if step.refused is None else "is too long"
        return cannot(
            f"the next request {size} and no turn is left to summarize (the newest turn alone is "
            "too large; lower limits.maxToolResultChars)",
            step.refused,
        )
    tools = [tool.definition for tool in ctx.tools.values()]
    request = ModelRequest(
        model=cfg.model,
        max_tokens=cfg.max_tokens,
        messages=summary_messages(state, cut, cfg.context),
        system=cfg.system,
        tools=tools,
        tool_choice={"type": "none"} if tools else None,
        temperature=cfg.temperature,
        user_id=cfg.run_id,
        server_context=summary_server_edits(state, cut, cfg.context),
    )
    answer = await summarize(request, ctx)
    if isinstance(answer, Finish):
        return answer
    summary = text_of(answer.content).strip()
    if not summary:
        return cannot(f"the summary request ended with stop_reason {answer.stop_reason!r} and no text")
    before = step.estimated_tokens
    compaction = Compaction(summary, cut.boundary, cut.turns, before, 0, state.iterations)
    fixed = fixed_chars(cfg.system, tools)
    state.compaction = compaction
    state.last_input_tokens = None  # the next request's report is the first one of this view
    after = estimate(state, sent_messages(state, cfg.context), fixed)
    state.compaction = Compaction(summary, cut.boundary, cut.turns, before, after, state.iterations)
    state.compaction_log.append(
        {"iteration": state.iterations, "turns": cut.turns, "tokensBefore": before, "tokensAfter": after}
    )
    await ctx.count_compaction(
        before=before, after=after, turns=cut.turns, usage=answer.usage, refused=step.refused is not None
    )
    # The summary request's own trace row, so the trace's usage adds up to the run's.
    row = TraceRow(
        state.iterations, COMPACTION, (), answer.usage, answer.model or cfg.model, answer.request_id
    )
    await ctx.emit_checkpoint(row, tools_pending=False, durable=True)
    return Prepare()


async def summarize(request: ModelRequest, ctx: Context) -> ModelResponse | Finish:
    """The summary request, retried like any model request within the run's deadline.

    Reserved like every model request (a summary is billed like any answer); not an iteration, so
    its events carry the run's current one.
    """
    state = ctx.state
    sent = await send_with_retries(request, ctx, iteration=state.iterations)
    if isinstance(sent, FatalModelError) and sent.context_window_exceeded:
        return cannot(f"the summary request itself was too long for the model: {sent.message}")
    if not isinstance(sent, Answered):
        return unanswered(sent, request="the summary request for context compaction")
    response = sent.response
    usage = response.usage if response.usage is not None else TokenUsage()
    state.add_usage(response.model or request.model, usage)
    await ctx.observer.notify(
        ModelRequestFinished(state.iterations, request.model, sent.elapsed, "ok", usage, response.stop_reason)
    )
    return response
