"""The agent loop as a small state machine.

Each step is a frozen dataclass whose `run` returns the next step; the return annotations name
the allowed transitions. Limits are checked in `Prepare`, before every model request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.loop.approving import ApprovalGate, Approvals, NoApprover
from agentrun.loop.config import LoopConfig
from agentrun.loop.dispatching import Dispatcher, ToolOutcome
from agentrun.loop.errors import FatalModelError, RetryableModelError, ToolError
from agentrun.loop.events import (
    Checkpoint,
    LoopDetected,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallRecovered,
)
from agentrun.loop.protocols import (
    Block,
    Clock,
    Message,
    ModelClient,
    ModelRequest,
    ModelResponse,
    Observer,
    Pricer,
    Tool,
    ToolCall,
)
from agentrun.loop.state import RunState, text_of, tool_uses

logger = logging.getLogger(__name__)
T = TypeVar("T")

CONTINUE_PROMPT = (
    "Your previous reply was cut off by the output token limit. Continue exactly where you left off."
)
REISSUE_HINT = "the call was cut off by the output token limit; reissue it with complete JSON input"
FINAL_TURN_PROMPT = (
    "The iteration limit of this run has been reached. Do not call any more tools. "
    "Reply now with your best final answer based on what you have so far."
)
TEXT_TOOL_CALL = re.compile(r"<tool_use>\s*(\{.*?\})\s*</tool_use>", re.DOTALL)


class CancelSignal(Protocol):
    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


class Interrupted(Exception):
    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass
class Context:
    config: LoopConfig
    model: ModelClient
    tools: Mapping[str, Tool]
    observer: Observer
    clock: Clock
    pricer: Pricer
    cancel: CancelSignal
    state: RunState
    dispatcher: Dispatcher
    deadline: float
    gate: ApprovalGate

    def gated(self, calls: Sequence[ToolCall]) -> set[str]:
        """Ids of calls whose tool is declared with requiresApproval."""
        return {
            c.id for c in calls if c.name in self.tools and self.tools[c.name].definition.requires_approval
        }

    async def emit_checkpoint(self, trace: TraceRow | None, *, tools_pending: bool) -> None:
        new = list(self.state.unpersisted())
        await self.observer.notify(
            Checkpoint(
                iteration=self.state.iterations,
                new_messages=new,
                message_count=len(self.state.messages),
                trace=trace,
                progress=self.state.progress(self.pricer),
                tools_pending=tools_pending,
                state=self.state.snapshot(self.config.loop_repeats),
            )
        )
        self.state.persisted = len(self.state.messages)

    async def guarded(self, awaitable: Awaitable[T]) -> T:
        """Await something that must stop on cancel or at the run's deadline, whichever first."""
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.cancel.wait())
        try:
            remaining = self.deadline - self.clock.monotonic()
            done, _ = await asyncio.wait(
                {work, stop}, timeout=max(remaining, 0), return_when="FIRST_COMPLETED"
            )
            if work in done:
                return work.result()
            raise Interrupted(StopReason.CANCELLED if stop in done else StopReason.TIMEOUT)
        finally:
            for task in (work, stop):
                if not task.done():
                    task.cancel()
            await asyncio.gather(work, stop, return_exceptions=True)

    def user_message(self, blocks: list[Block]) -> Message:
        """Every user turn we write carries the final-turn notice once the iteration limit is hit."""
        if self.state.iterations >= self.config.max_iterations and not self.state.final_turn:
            blocks = [*blocks, {"type": "text", "text": FINAL_TURN_PROMPT}]
        return {"role": "user", "content": blocks}


@dataclass(frozen=True)
class Finish:
    outcome: Outcome


@dataclass(frozen=True)
class Prepare:
    async def run(self, ctx: Context) -> CallModel | Finish:
        cfg, state = ctx.config, ctx.state
        if ctx.cancel.is_set():
            return Finish(Outcome(StopReason.CANCELLED, "spec.cancel was set"))
        if ctx.clock.monotonic() >= ctx.deadline:
            return Finish(Outcome(StopReason.TIMEOUT, f"timeoutSeconds={cfg.timeout_seconds:g} reached"))
        if cfg.token_budget is not None and state.usage.total >= cfg.token_budget:
            return Finish(
                Outcome(
                    StopReason.TOKEN_BUDGET_EXCEEDED,
                    f"used {state.usage.total} of tokenBudget {cfg.token_budget} tokens",
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
        if state.iterations >= cfg.max_iterations:
            if state.final_turn:
                return Finish(
                    Outcome(
                        StopReason.MAX_ITERATIONS,
                        f"maxIterations={cfg.max_iterations} reached; final answer turn also used",
                    )
                )
            return CallModel(final=True)
        return CallModel(final=False)


@dataclass(frozen=True)
class CallModel:
    final: bool

    def request(self, ctx: Context) -> ModelRequest:
        cfg, state = ctx.config, ctx.state
        choice: dict[str, Any] | None = None
        if self.final:
            choice = {"type": "none"} if ctx.tools else None
        elif state.iterations == 0 and cfg.first_tool_choice is not None:
            choice = cfg.first_tool_choice
        return ModelRequest(
            model=cfg.model,
            max_tokens=cfg.max_tokens,
            messages=list(state.messages),
            system=cfg.system,
            tools=[tool.definition for tool in ctx.tools.values()],
            tool_choice=choice,
            temperature=cfg.temperature,
            stop_sequences=(*cfg.stop_sequences, *cfg.finish_sequences),
            user_id=cfg.run_id,
        )

    async def run(self, ctx: Context) -> Handle | Finish:
        request = self.request(ctx)
        attempt = 0
        while True:
            started = ctx.clock.monotonic()
            iteration = ctx.state.iterations + 1
            try:
                response = await ctx.guarded(ctx.model.complete(request))
            except RetryableModelError as exc:
                attempt += 1
                elapsed = ctx.clock.monotonic() - started
                await ctx.observer.notify(
                    ModelRequestFinished(iteration, request.model, elapsed, exc.retry_class.value)
                )
                if attempt > ctx.config.retry.max_retries:
                    return Finish(
                        Outcome(
                            StopReason.MODEL_ERROR,
                            f"model API still failing after {attempt} attempts "
                            f"({exc.retry_class.value}): {exc.message}",
                            condition_reason="ModelRetriesExhausted",
                        )
                    )
                delay = exc.retry_after
                if delay is None:
                    delay = ctx.config.retry.backoff(attempt, ctx.clock.random())
                # Never sleep past the deadline: the run would only wake up to time out.
                delay = max(0.0, min(delay, ctx.deadline - ctx.clock.monotonic()))
                await ctx.observer.notify(
                    ModelRetryScheduled(iteration, exc.retry_class.value, attempt, delay, exc.message)
                )
                await ctx.guarded(ctx.clock.sleep(delay))
                if ctx.clock.monotonic() >= ctx.deadline:
                    # A retry sent now would be abandoned at once; don't make the server do the work.
                    raise Interrupted(StopReason.TIMEOUT) from exc
                continue
            except FatalModelError as exc:
                elapsed = ctx.clock.monotonic() - started
                await ctx.observer.notify(ModelRequestFinished(iteration, request.model, elapsed, "error"))
                if exc.context_window_exceeded:
                    return Finish(Outcome(StopReason.CONTEXT_WINDOW_EXCEEDED, exc.message))
                status = f"HTTP {exc.status}: " if exc.status else ""
                return Finish(
                    Outcome(StopReason.MODEL_ERROR, f"{status}{exc.message}", condition_reason=exc.reason)
                )
            elapsed = ctx.clock.monotonic() - started
            ctx.state.iterations = iteration
            ctx.state.add_usage(response.model or request.model, response.usage)
            if self.final:
                ctx.state.final_turn = True
            await ctx.observer.notify(
                ModelRequestFinished(
                    iteration, request.model, elapsed, "ok", response.usage, response.stop_reason
                )
            )
            return Handle(response, final=self.final)


@dataclass(frozen=True)
class Handle:
    """The exhaustive stop_reason switch: every value, including ones not yet invented."""

    response: ModelResponse
    final: bool

    def trace(self, ctx: Context, tools: Sequence[ToolOutcome] = ()) -> TraceRow:
        r = self.response
        return TraceRow(
            ctx.state.iterations, r.stop_reason, tuple(t.trace for t in tools), r.usage, r.model, r.request_id
        )

    async def append_and_checkpoint(self, ctx: Context, follow_up: Message | None) -> None:
        ctx.state.messages.append({"role": "assistant", "content": self.response.content})
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
                            f"not run: the reply ended with stop_reason {self.response.stop_reason!r}",
                            hint="request tools in a reply that ends with stop_reason tool_use",
                        ).as_payload()
                    ),
                    "is_error": True,
                }
                for block in tool_uses(self.response.content)
            ]
            ctx.state.messages.append({**follow_up, "content": [*skipped, *follow_up["content"]]})
        await ctx.emit_checkpoint(self.trace(ctx), tools_pending=False)

    async def run(self, ctx: Context) -> RunTools | Prepare | Finish:
        r, state, cfg = self.response, ctx.state, ctx.config
        match r.stop_reason:
            case "end_turn":
                return await self.end_turn(ctx)
            case "tool_use":
                if self.final:
                    # tool_choice none was ignored; the final turn is over either way.
                    await self.append_and_checkpoint(ctx, None)
                    return self.finish_max_iterations(ctx)
                return await self.start_tools(ctx, truncated=False)
            case "max_tokens":
                if tool_uses(r.content) and not self.final:
                    cut_mid_call = bool(r.content) and r.content[-1].get("type") == "tool_use"
                    if state.reissues >= cfg.max_reissues:
                        await self.append_and_checkpoint(ctx, None)
                        return Finish(
                            Outcome(StopReason.MAX_TOKENS, "tool calls kept getting cut off by maxTokens")
                        )
                    state.reissues += int(cut_mid_call)
                    return await self.start_tools(ctx, truncated=cut_mid_call)
                state.text_parts.append(text_of(r.content))
                if self.final or state.continuations >= cfg.max_continuations:
                    await self.append_and_checkpoint(ctx, None)
                    if self.final:
                        return self.finish_max_iterations(ctx)
                    return Finish(
                        Outcome(
                            StopReason.MAX_TOKENS,
                            f"the answer was still cut off by maxTokens={cfg.max_tokens} after "
                            f"{state.continuations} continuations; the partial text is in the transcript",
                        )
                    )
                state.continuations += 1
                await self.append_and_checkpoint(
                    ctx, ctx.user_message([{"type": "text", "text": CONTINUE_PROMPT}])
                )
                return Prepare()
            case "stop_sequence":
                if r.stop_sequence in cfg.finish_sequences:
                    await self.append_and_checkpoint(ctx, None)
                    return Finish(
                        Outcome(
                            StopReason.FINISH_SEQUENCE,
                            f"finished at finish sequence {r.stop_sequence!r}",
                            result=self.joined_text(ctx) or None,
                        )
                    )
                if self.final or state.drift_reprompts >= cfg.max_drift_reprompts:
                    await self.append_and_checkpoint(ctx, None)
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
                await self.append_and_checkpoint(ctx, ctx.user_message([{"type": "text", "text": note}]))
                return Prepare()
            case "pause_turn":
                # The server paused a long turn; sending the content back lets it resume. Client
                # tool calls in a paused turn still need answers, or the next request is invalid.
                if tool_uses(r.content) and not self.final:
                    return await self.start_tools(ctx, truncated=False)
                await self.append_and_checkpoint(ctx, None)
                return Prepare()
            case "refusal":
                await self.append_and_checkpoint(ctx, None)
                category = (r.stop_details or {}).get("category")
                detail = f" (category: {category})" if category else ""
                return Finish(Outcome(StopReason.REFUSAL, f"the model declined the task{detail}"))
            case "model_context_window_exceeded":
                await self.append_and_checkpoint(ctx, None)
                return Finish(
                    Outcome(StopReason.CONTEXT_WINDOW_EXCEEDED, "the conversation outgrew the context window")
                )
            case _:
                logger.warning("unexpected stop_reason %r from the model", r.stop_reason)
                await self.append_and_checkpoint(ctx, None)
                return Finish(
                    Outcome(
                        StopReason.UNEXPECTED_STOP_REASON,
                        f"the model returned an unknown stop_reason {r.stop_reason!r}",
                        raw_stop_reason=str(r.stop_reason),
                    )
                )

    def joined_text(self, ctx: Context) -> str:
        return "".join([*ctx.state.text_parts, text_of(self.response.content)])

    def finish_max_iterations(self, ctx: Context) -> Finish:
        text = self.joined_text(ctx) if self.response.stop_reason != "max_tokens" else ""
        return Finish(
            Outcome(
                StopReason.MAX_ITERATIONS,
                f"maxIterations={ctx.config.max_iterations} reached; "
                + ("result holds the final answer turn" if text else "the final answer turn gave no text"),
                result=text or None,
            )
        )

    async def end_turn(self, ctx: Context) -> RunTools | Prepare | Finish:
        state, cfg = ctx.state, ctx.config
        recovered = None if self.final else self.recover_text_tool_call(ctx)
        if recovered is not None:
            return recovered
        if self.final:
            await self.append_and_checkpoint(ctx, None)
            return self.finish_max_iterations(ctx)
        missing = [name for name in cfg.required_tools if name not in state.succeeded_tools]
        if missing:
            if state.deliverable_nudges >= cfg.max_deliverable_nudges:
                await self.append_and_checkpoint(ctx, None)
                return Finish(
                    Outcome(
                        StopReason.DELIVERABLE_UNVERIFIED,
                        f"the model finished without running required tools: {', '.join(missing)}",
                        result=self.joined_text(ctx) or None,
                    )
                )
            state.deliverable_nudges += 1
            note = (
                "You ended your turn, but the task is not complete: these required tools have not run "
                f"successfully yet: {', '.join(missing)}. Call them before finishing."
            )
            state.text_parts.clear()
            await self.append_and_checkpoint(ctx, ctx.user_message([{"type": "text", "text": note}]))
            return Prepare()
        await self.append_and_checkpoint(ctx, None)
        text = self.joined_text(ctx)
        if not text.strip():
            return Finish(Outcome(StopReason.END_TURN, "the model ended its turn with an empty answer"))
        return Finish(Outcome(StopReason.END_TURN, "the model finished its answer", result=text))

    def recover_text_tool_call(self, ctx: Context) -> RunTools | None:
        """A model sometimes writes a call as JSON in <tool_use> tags; run it rather than lose it."""
        match = TEXT_TOOL_CALL.search(text_of(self.response.content))
        if match is None or tool_uses(self.response.content):
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
        return RunTools(response=self.response, truncated=False, recovered=(name, args))

    async def start_tools(self, ctx: Context, *, truncated: bool) -> RunTools:
        ctx.state.messages.append({"role": "assistant", "content": self.response.content})
        ctx.state.in_flight = self.trace(ctx)
        # Persist the request for tools before running them: a restart re-runs these ids.
        await ctx.emit_checkpoint(None, tools_pending=True)
        return RunTools(response=self.response, truncated=truncated)


@dataclass(frozen=True)
class RunTools:
    response: ModelResponse | None  # None when resuming a turn that was in flight
    truncated: bool
    recovered: tuple[str, dict[str, Any]] | None = None

    async def run(self, ctx: Context) -> Prepare | Finish:
        if self.recovered is not None:
            return await self.run_recovered(ctx)
        state, cfg = ctx.state, ctx.config
        blocks = state.pending_tool_uses()
        calls: list[ToolCall] = []
        rejected: dict[str, ToolError] = {}
        for index, block in enumerate(blocks):
            raw_input = block.get("input")
            call = ToolCall(
                id=str(block["id"]),
                name=str(block.get("name", "")),
                input=raw_input if isinstance(raw_input, dict) else {},
                idempotency_key=f"{cfg.run_id}:{block['id']}",
                iteration=state.iterations,
            )
            calls.append(call)
            if self.truncated and index == len(blocks) - 1:
                rejected[call.id] = ToolError(
                    "truncated_input", "the tool input was cut off", hint=REISSUE_HINT
                )
            elif call.name not in ctx.tools:
                available = ", ".join(sorted(ctx.tools)) or "none"
                rejected[call.id] = ToolError(
                    "unknown_tool",
                    f"there is no tool named {call.name!r}",
                    hint=f"available tools: {available}",
                )
        try:
            outcomes, denied = await ctx.guarded(
                ctx.gate.run(ctx.dispatcher, calls, rejected, ctx.gated(calls))
            )
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
        # The model answer's row was kept in the state (and in the checkpoint) before the tools ran,
        # so a resumed run (response None) completes the same row rather than inventing one.
        head = state.in_flight or TraceRow(state.iterations, "tool_use", (), TokenUsage(), cfg.model)
        state.in_flight = None
        trace = dataclasses.replace(head, tool_calls=tuple(o.trace for o in outcomes))
        await ctx.emit_checkpoint(trace, tools_pending=False)
        return await self.judge(ctx, outcomes)

    async def judge(self, ctx: Context, outcomes: Sequence[ToolOutcome]) -> Prepare | Finish:
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
                loop = self.detect_loop(ctx, outcome)
                if loop is not None:
                    await ctx.observer.notify(LoopDetected(state.iterations, loop, outcome.trace.name))
                    return Finish(Outcome(StopReason.LOOP_DETECTED, f"{loop} ({outcome.trace.name})"))
        return Prepare()

    def detect_loop(self, ctx: Context, outcome: ToolOutcome) -> str | None:
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

    async def run_recovered(self, ctx: Context) -> Prepare | Finish:
        assert self.recovered is not None and self.response is not None
        name, args = self.recovered
        state = ctx.state
        await ctx.observer.notify(ToolCallRecovered(state.iterations, name))
        call = ToolCall(
            id=f"text-{state.iterations}",
            name=name,
            input=args,
            idempotency_key=f"{ctx.config.run_id}:text-{state.iterations}",
            iteration=state.iterations,
        )
        state.messages.append({"role": "assistant", "content": self.response.content})
        await ctx.emit_checkpoint(None, tools_pending=False)
        # A call written as text needs the same approval as a real one: no way around the gate.
        outcomes, denied = await ctx.guarded(ctx.gate.run(ctx.dispatcher, [call], {}, ctx.gated([call])))
        outcome = outcomes[0]
        state.tool_calls += 0 if denied else 1
        await ctx.observer.notify(ToolCallFinished(state.iterations, outcome.trace))
        if outcome.trace.ok:
            state.succeeded_tools.add(name)
        body = outcome.block["content"]
        done = "It was not approved, so it did not run" if denied else "It was run for you"
        note = (
            f"You wrote a call to {name} as text instead of using the tool interface. {done}; "
            f"{'error' if not outcome.trace.ok else 'result'}:\n{body}\nUse real tool calls from now on."
        )
        state.messages.append(ctx.user_message([{"type": "text", "text": note}]))
        trace = TraceRow(
            state.iterations,
            self.response.stop_reason,
            (outcome.trace,),
            self.response.usage,
            self.response.model,
            self.response.request_id,
        )
        await ctx.emit_checkpoint(trace, tools_pending=False)
        return await self.judge(ctx, outcomes)


Step = Prepare | CallModel | Handle | RunTools


async def run_loop(
    config: LoopConfig,
    *,
    model: ModelClient,
    tools: Mapping[str, Tool],
    observer: Observer,
    clock: Clock,
    pricer: Pricer,
    cancel: CancelSignal,
    state: RunState | None = None,
    elapsed_before: float = 0.0,
    approvals: Approvals | None = None,
) -> Outcome:
    """Run (or resume, given a restored state) one agent loop to a terminal Outcome.

    Never raises for anything the model or tools do; only cancellation of the calling task
    (operator shutdown, object deletion) propagates, leaving the last checkpoint to resume from.
    """
    resumed = state is not None
    state = state if state is not None else RunState.fresh(config.task)
    dispatcher = Dispatcher(
        tools,
        clock=clock,
        concurrency=config.tool_concurrency,
        timeout_seconds=config.tool_timeout_seconds,
        max_result_chars=config.max_tool_result_chars,
    )
    ctx = Context(
        config=config,
        model=model,
        tools=tools,
        observer=observer,
        clock=clock,
        pricer=pricer,
        cancel=cancel,
        state=state,
        dispatcher=dispatcher,
        gate=ApprovalGate(
            approvals if approvals is not None else NoApprover(),
            clock,
            observer,
            config.approval_timeout_seconds,
        ),
        deadline=clock.monotonic() + config.timeout_seconds - elapsed_before,
    )
    await observer.notify(RunStarted(resumed=resumed, progress=state.progress(pricer)))
    if not resumed:
        await ctx.emit_checkpoint(None, tools_pending=False)
    step: Step | Finish = RunTools(response=None, truncated=False) if state.pending_tool_uses() else Prepare()
    while not isinstance(step, Finish):
        try:
            step = await step.run(ctx)
        except Interrupted as exc:
            message = (
                "spec.cancel was set"
                if exc.reason is StopReason.CANCELLED
                else (f"timeoutSeconds={config.timeout_seconds:g} reached")
            )
            step = Finish(Outcome(exc.reason, message))
    outcome = step.outcome
    await observer.notify(RunFinished(outcome=outcome, progress=state.progress(pricer)))
    return outcome
