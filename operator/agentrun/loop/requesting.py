"""The step that asks the model: one request, with the retries of transient errors inside the deadline.

The retries, reservations and deadline are `sending`'s (the one retry layer for the model, shared
with compaction's summary request); this step builds the request, says what each outcome means for
the run and records the answer. A request that does not fit a quota ends the run QuotaExceeded
without reaching the API.
"""

from __future__ import annotations

from typing import Any

from agentrun.api.usage import TokenUsage
from agentrun.loop.context import Context
from agentrun.loop.errors import FatalModelError
from agentrun.loop.events import ModelRequestFinished
from agentrun.loop.protocols import AppliedContextEdits, ModelRequest
from agentrun.loop.sending import Answered, send_with_retries, unanswered
from agentrun.loop.steps import CallModel, Compact, Finish, Handle
from agentrun.loop.windowing import estimate, fixed_chars, overflow, sent_messages, view_chars


def build_request(step: CallModel, ctx: Context) -> ModelRequest:
    cfg, state = ctx.config, ctx.state
    choice: dict[str, Any] | None = None
    if step.final:
        choice = {"type": "none"} if ctx.tools else None
    elif state.iterations == 0 and cfg.first_tool_choice is not None:
        choice = cfg.first_tool_choice
    return ModelRequest(
        model=cfg.model,
        max_tokens=cfg.max_tokens,
        messages=sent_messages(state, cfg.context),
        system=cfg.system,
        tools=[tool.definition for tool in ctx.tools.values()],
        tool_choice=choice,
        temperature=cfg.temperature,
        stop_sequences=(*cfg.stop_sequences, *cfg.finish_sequences),
        user_id=cfg.run_id,
        thinking=cfg.thinking,
        server_context=cfg.context.server_edits,
    )


async def call_model(step: CallModel, ctx: Context) -> Handle | Compact | Finish:
    request = build_request(step, ctx)
    iteration = ctx.state.iterations + 1
    sent = await send_with_retries(request, ctx, iteration=iteration)
    if isinstance(sent, FatalModelError) and sent.context_window_exceeded:
        # Compacted (once per turn) if management is on, else the message says why not.
        return overflow(ctx.state, ctx.config.context, sent.message, request)
    if not isinstance(sent, Answered):
        return unanswered(sent)
    await record_answer(step, ctx, request, sent, iteration)
    return Handle(sent.response, final=step.final, elapsed=sent.elapsed)


async def record_answer(
    step: CallModel, ctx: Context, request: ModelRequest, answered: Answered, iteration: int
) -> None:
    """The answer counted in the state (iteration, usage, sizes), then told to the observers."""
    response = answered.response
    edits = response.context_edits
    compacted = edits if edits is not None and edits.compacted else None
    # Estimated before the state learns this response's size: what the request held before
    # a compaction on the server made it smaller (only then: it serialises the request).
    before = (
        estimate(ctx.state, request.messages, fixed_chars(request.system, request.tools))
        if compacted is not None
        else 0
    )
    ctx.state.iterations = iteration
    ctx.state.add_usage(response.model or request.model, response.usage)
    u = response.usage
    # A compaction on the server is in the usage (it is billed) but not in the request's size.
    c = edits.compaction_usage if edits is not None and edits.compaction_usage else TokenUsage()
    ctx.state.last_input_tokens = max(
        u.input_tokens
        + u.cache_creation_input_tokens
        + u.cache_read_input_tokens
        - (c.input_tokens + c.cache_creation_input_tokens + c.cache_read_input_tokens),
        0,
    )
    ctx.state.last_sent_chars = view_chars(ctx.state, request.messages)
    # What the next request is measured against; after a compaction on the server the API reads
    # less than the request holds, so it is measured whole again.
    ctx.sizes.learn(request, ctx.state.compaction, ctx.state.last_input_tokens if compacted is None else None)
    if step.final:
        ctx.state.final_turn = True
    await ctx.observer.notify(
        ModelRequestFinished(
            iteration, request.model, answered.elapsed, "ok", response.usage, response.stop_reason
        )
    )
    if compacted is not None:
        await compacted_on_server(ctx, request, compacted, before)


async def compacted_on_server(
    ctx: Context, request: ModelRequest, edits: AppliedContextEdits, before: int
) -> None:
    """Counted like the loop's own compactions, where the data allows: the size after is what the
    API reports it read, the size before is the estimate, and the summarized turns are all before."""
    state = ctx.state
    after = state.last_input_tokens or 0
    turns = sum(1 for m in request.messages if m.get("role") == "assistant")
    # Not in compaction_log: that log describes the trace's rows of summary requests, and a
    # compaction on the server has no request of its own.
    await ctx.count_compaction(
        before=before, after=after, turns=turns, usage=edits.compaction_usage or TokenUsage()
    )
