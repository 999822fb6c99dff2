"""The model's answer, switched on its stop_reason: every value, including ones not yet invented.

Each reason ends the run, asks again (continue a cut answer, re-prompt after a stop-sequence
drift, nudge toward required tools) or hands tool calls to the tool phase. The bounds on those
corrective turns live in the config, so a misbehaving model cannot keep a run going forever.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import TraceRow
from agentrun.loop import answers
from agentrun.loop.context import Context
from agentrun.loop.dispatching import ToolOutcome
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import Block, Message
from agentrun.loop.state import text_of, tool_uses
from agentrun.loop.steps import Finish, Handle, Prepare, RunTools

logger = logging.getLogger(__name__)

CONTINUE_PROMPT = (
    "Your previous reply was cut off by the output token limit. Continue exactly where you left off."
)
TEXT_TOOL_CALL = re.compile(r"<tool_use>\s*(\{.*?\})\s*</tool_use>", re.DOTALL)


async def handle(step: Handle, ctx: Context) -> RunTools | Prepare | Finish:
    """One function per stop_reason, the unknown ones included (:func:`unexpected_stop`)."""
    match step.response.stop_reason:
        case "end_turn":
            return await end_turn(step, ctx)
        case "tool_use":
            if step.final:
                # tool_choice none was ignored; the final turn is over either way.
                await append_and_checkpoint(step, ctx, None)
                return finish_max_iterations(step, ctx)
            return await start_tools(step, ctx, truncated=False)
        case "max_tokens":
            return await max_tokens(step, ctx)
        case "stop_sequence":
            return await stop_sequence(step, ctx)
        case "pause_turn":
            # The server paused a long turn; sending the content back lets it resume. Client
            # tool calls in a paused turn still need answers, or the next request is invalid.
            if tool_uses(step.response.content) and not step.final:
                return await start_tools(step, ctx, truncated=False)
            await append_and_checkpoint(step, ctx, None)
            return Prepare()
        case "refusal":
            await append_and_checkpoint(step, ctx, None)
            category = (step.response.stop_details or {}).get("category")
            detail = f" (category: {category})" if category else ""
            return Finish(Outcome(StopReason.REFUSAL, f"the model declined the task{detail}"))
        case "model_context_window_exceeded":
            return await context_window_exceeded(step, ctx)
        case _:
            return await unexpected_stop(step, ctx)


async def max_tokens(step: Handle, ctx: Context) -> RunTools | Prepare | Finish:
    """A cut answer: its tool calls run (a call cut in the middle is reissued, a bounded number of
    times); cut text is continued in a new turn while continuations last."""
    r, state, cfg = step.response, ctx.state, ctx.config
    if tool_uses(r.content) and not step.final:
        cut_mid_call = bool(r.content) and r.content[-1].get("type") == "tool_use"
        if state.reissues >= cfg.max_reissues:
            await append_and_checkpoint(step, ctx, None)
            return Finish(Outcome(StopReason.MAX_TOKENS, "tool calls kept getting cut off by maxTokens"))
        state.reissues += int(cut_mid_call)
        return await start_tools(step, ctx, truncated=cut_mid_call)
    state.text_parts.append(text_of(r.content))
    if step.final or state.continuations >= cfg.max_continuations:
        await append_and_checkpoint(step, ctx, None)
        if step.final:
            return finish_max_iterations(step, ctx)
        return Finish(
            Outcome(
                StopReason.MAX_TOKENS,
                f"the answer was still cut off by maxTokens={cfg.max_tokens} after "
                f"{state.continuations} continuations; the partial text is in the transcript",
            )
        )
    state.continuations += 1
    await append_and_checkpoint(step, ctx, ctx.user_message([{"type": "text", "text": CONTINUE_PROMPT}]))
    return Prepare()


async def stop_sequence(step: Handle, ctx: Context) -> Prepare | Finish:
    """A finish sequence ends the run with the answer; any other stop sequence is drift: the answer
    is discarded and the model asked again, a bounded number of times."""
    r, state, cfg = step.response, ctx.state, ctx.config
    if r.stop_sequence in cfg.finish_sequences:
        return await finish_answer(
            step, ctx, StopReason.FINISH_SEQUENCE, f"finished at finish sequence {r.stop_sequence!r}"
        )
    if step.final or state.drift_reprompts >= cfg.max_drift_reprompts:
        await append_and_checkpoint(step, ctx, None)
        return Finish(
            Outcome(
                StopReason.STOP_SEQUENCE_DRIFT,
                f"the model kept running into stop sequence {r.stop_sequence!r}",
            )
        )
    state.drift_reprompts += 1
    state.text_parts.clear()
    note = (
        f"Your previous reply ran into the stop sequence {r.stop_sequence!r} and was discarded. "
        "Answer again without producing it."
    )
    await append_and_checkpoint(step, ctx, ctx.user_message([{"type": "text", "text": note}]))
    return Prepare()


async def context_window_exceeded(step: Handle, ctx: Context) -> Finish:
    await append_and_checkpoint(step, ctx, None)
    why = (
        "context compaction is off (spec.context.compaction.enabled: false)"
        if not ctx.config.context.compaction
        else "context management could not make room: the answer filled what the window had "
        "left; lower spec.context.compaction.thresholdPercent or model.maxTokens"
    )
    return Finish(
        Outcome(
            StopReason.CONTEXT_WINDOW_EXCEEDED,
            f"the conversation outgrew the context window while the model answered ({why})",
        )
    )


async def unexpected_stop(step: Handle, ctx: Context) -> Finish:
    """A stop_reason this operator does not know (the API may add one): the run ends saying which."""
    r = step.response
    logger.warning("unexpected stop_reason %r from the model", r.stop_reason)
    await append_and_checkpoint(step, ctx, None)
    return Finish(
        Outcome(
            StopReason.UNEXPECTED_STOP_REASON,
            f"the model returned an unknown stop_reason {r.stop_reason!r}",
            raw_stop_reason=str(r.stop_reason),
        )
    )


def trace_row(step: Handle, ctx: Context, tools: Sequence[ToolOutcome] = ()) -> TraceRow:
    r = step.response
    return TraceRow(
        ctx.state.iterations,
        r.stop_reason,
        tuple(t.trace for t in tools),
        r.usage,
        r.model,
        r.request_id,
        step.elapsed,
    )


async def append_and_checkpoint(step: Handle, ctx: Context, follow_up: Message | None) -> None:
    ctx.state.messages.append({"role": "assistant", "content": step.response.content})
    if follow_up is not None:
        # Calls next to a stop reason that does not run them still need one answer each,
        # or the API rejects the next request.
        skipped = [
            {
                "type": "tool_result",
                "tool_use_id": block["id"],
                "content": json.dumps(
                    ToolError(
                        "not_run",
                        f"not run: the reply ended with stop_reason {step.response.stop_reason!r}",
                        hint="request tools in a reply that ends with stop_reason tool_use",
                    ).as_payload()
                ),
                "is_error": True,
            }
            for block in tool_uses(step.response.content)
        ]
        ctx.state.messages.append({**follow_up, "content": [*skipped, *follow_up["content"]]})
    await ctx.emit_checkpoint(trace_row(step, ctx), tools_pending=False)


def joined_text(step: Handle, ctx: Context) -> str:
    return "".join([*ctx.state.text_parts, text_of(step.response.content)])


def finish_max_iterations(step: Handle, ctx: Context) -> Finish:
    text = joined_text(step, ctx) if step.response.stop_reason != "max_tokens" else ""
    return Finish(
        Outcome(
            StopReason.MAX_ITERATIONS,
            f"maxIterations={ctx.config.limits.max_iterations} reached; "
            + ("result holds the final answer turn" if text else "the final answer turn gave no text"),
            result=text or None,
        )
    )


async def end_turn(step: Handle, ctx: Context) -> RunTools | Prepare | Finish:
    state, cfg = ctx.state, ctx.config
    recovered = None if step.final else recover_text_tool_call(step, ctx)
    if recovered is not None:
        return recovered
    if step.final:
        await append_and_checkpoint(step, ctx, None)
        return finish_max_iterations(step, ctx)
    missing = [name for name in cfg.required_tools if name not in state.succeeded_tools]
    if missing:
        # The API refuses an empty assistant turn in the history, so such a turn cannot be nudged.
        empty = not resendable(step.response.content)
        if empty or state.deliverable_nudges >= cfg.max_deliverable_nudges:
            await append_and_checkpoint(step, ctx, None)
            why = "; its answer was empty and cannot be sent back with a nudge" if empty else ""
            return Finish(
                Outcome(
                    StopReason.DELIVERABLE_UNVERIFIED,
                    f"the model finished without running required tools: {', '.join(missing)}{why}",
                    result=joined_text(step, ctx) or None,
                )
            )
        state.deliverable_nudges += 1
        note = (
            "You ended your turn, but the task is not complete: these required tools have not run "
            f"successfully yet: {', '.join(missing)}. Call them before finishing."
        )
        state.text_parts.clear()
        await append_and_checkpoint(step, ctx, ctx.user_message([{"type": "text", "text": note}]))
        return Prepare()
    return await finish_answer(step, ctx, StopReason.END_TURN, "the model finished its answer")


async def finish_answer(step: Handle, ctx: Context, reason: StopReason, message: str) -> Prepare | Finish:
    """A natural finish: free text, or JSON that spec.output.schema accepts.

    An answer the schema refuses goes back to the model with the errors while retries last; the
    retry is an ordinary turn, so limits, budgets and the iteration count apply to it.
    """
    state, cfg = ctx.state, ctx.config
    text = joined_text(step, ctx)
    if cfg.output_schema is None:
        await append_and_checkpoint(step, ctx, None)
        if reason is StopReason.END_TURN and not text.strip():
            return Finish(Outcome(reason, "the model ended its turn with an empty answer"))
        return Finish(Outcome(reason, message, result=text or None))
    try:
        checked = answers.check(text, cfg.output_schema)
    except answers.UnusableSchema as exc:
        await append_and_checkpoint(step, ctx, None)
        return Finish(Outcome(StopReason.INVALID_SPEC, str(exc)))
    if checked.valid:
        await append_and_checkpoint(step, ctx, None)
        return Finish(
            Outcome(
                reason,
                f"{message}; it matches spec.output.schema",
                result=checked.text,
                output=checked.value,
            )
        )
    if state.output_retries >= cfg.max_output_retries or not resendable(step.response.content):
        await append_and_checkpoint(step, ctx, None)
        why = (
            f"after {state.output_retries} retries"
            if resendable(step.response.content)
            else "and an empty turn cannot be sent back to retry"
        )
        return Finish(
            Outcome(
                StopReason.INVALID_OUTPUT,
                f"the answer did not match spec.output.schema {why}: {'; '.join(checked.errors)}",
                result=text or None,
            )
        )
    state.output_retries += 1
    state.text_parts.clear()
    note = answers.retry_prompt(checked.errors, state.output_retries, cfg.max_output_retries)
    await append_and_checkpoint(step, ctx, ctx.user_message([{"type": "text", "text": note}]))
    return Prepare()


def resendable(content: Sequence[Block]) -> bool:
    """Whether the API takes this turn back in the history: it refuses empty turns and empty text."""
    return bool(content) and all(b.get("type") != "text" or str(b.get("text", "")).strip() for b in content)


def recover_text_tool_call(step: Handle, ctx: Context) -> RunTools | None:
    """A model sometimes writes a call as JSON in <tool_use> tags; run it rather than lose it."""
    match = TEXT_TOOL_CALL.search(text_of(step.response.content))
    if match is None or tool_uses(step.response.content):
        return None
    try:
        parsed = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    name, args = parsed.get("name"), parsed.get("input", {})
    if not isinstance(name, str) or name not in ctx.tools or not isinstance(args, dict):
        return None
    return RunTools(response=step.response, truncated=False, recovered=(name, args))


async def start_tools(step: Handle, ctx: Context, *, truncated: bool) -> RunTools:
    ctx.state.messages.append({"role": "assistant", "content": step.response.content})
    ctx.state.in_flight = trace_row(step, ctx)
    # Persist the request for tools before running them: a restart re-runs these ids.
    await ctx.emit_checkpoint(None, tools_pending=True)
    return RunTools(response=step.response, truncated=truncated)
