"""The agent loop as a small state machine: the driver that runs one step after another.

Each step is a frozen dataclass (`steps`); the function that runs it returns the next step, and
its return annotation names the allowed transitions. Limits are checked in `Prepare`, before
every model request (`limiting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import assert_never

from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.approving import ApprovalGate, Approvals, NoApprover
from agentrun.loop.compacting import compact
from agentrun.loop.config import LoopConfig
from agentrun.loop.context import CancelSignal, Context, Interrupted
from agentrun.loop.dispatching import Dispatcher
from agentrun.loop.errors import HandedOff
from agentrun.loop.events import RunFinished, RunStarted, RunYielded
from agentrun.loop.limiting import prepare
from agentrun.loop.protocols import Allowance, Clock, ModelClient, Observer, Pricer, Tool
from agentrun.loop.requesting import call_model
from agentrun.loop.responding import handle
from agentrun.loop.state import RunState
from agentrun.loop.steps import CallModel, Compact, Finish, Handle, Prepare, RunTools, Step
from agentrun.loop.tool_calling import run_tools


async def advance(step: Step, ctx: Context) -> Step | Finish:
    match step:
        case Prepare():
            return await prepare(ctx)
        case Compact():
            return await compact(step, ctx)
        case CallModel():
            return await call_model(step, ctx)
        case Handle():
            return await handle(step, ctx)
        case RunTools():
            return await run_tools(step, ctx)
        case _:
            assert_never(step)


def at_checkpoint(step: Step, state: RunState) -> bool:
    """Whether the run could resume from what it has told its observers, with nothing in flight: not
    with an answer received but not yet recorded (Handle), nor with messages not yet checkpointed."""
    return not isinstance(step, Handle) and not state.unpersisted()


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
    allowance: Allowance | None = None,
    yield_at_checkpoint: CancelSignal | None = None,
) -> Outcome:
    """Run (or resume, given a restored state) one agent loop to a terminal Outcome.

    Never raises for anything the model or tools do; only cancellation of the calling task
    (operator shutdown, object deletion) propagates, leaving the last checkpoint to resume from.
    `allowance` holds every model request to the namespace's quotas (None: no quotas).

    Once `yield_at_checkpoint` is set the loop goes on only to its next checkpoint (the model
    answer in flight recorded, or the tool results recorded), tells its observers (RunYielded) and
    raises HandedOff: the next owner resumes from there and asks nothing again. Unlike `cancel`,
    this is not an end of the run.
    """
    resumed = state is not None
    state = state if state is not None else RunState.fresh(config.task)
    ctx = _context(
        config,
        model=model,
        tools=tools,
        observer=observer,
        clock=clock,
        pricer=pricer,
        cancel=cancel,
        state=state,
        elapsed_before=elapsed_before,
        approvals=approvals,
        allowance=allowance,
    )
    try:
        outcome = await _steps(ctx, resumed=resumed, yield_at_checkpoint=yield_at_checkpoint)
    finally:
        await ctx.close()
    await observer.notify(RunFinished(outcome=outcome, progress=state.progress(pricer)))
    return outcome


async def _steps(ctx: Context, *, resumed: bool, yield_at_checkpoint: CancelSignal | None) -> Outcome:
    state, observer, pricer = ctx.state, ctx.observer, ctx.pricer
    await observer.notify(
        RunStarted(resumed=resumed, progress=state.progress(pricer), tools=tuple(sorted(ctx.tools)))
    )
    if not resumed:
        await ctx.emit_checkpoint(None, tools_pending=False)
    step: Step | Finish = RunTools(response=None, truncated=False) if state.pending_tool_uses() else Prepare()
    while not isinstance(step, Finish):
        if yield_at_checkpoint is not None and yield_at_checkpoint.is_set() and at_checkpoint(step, state):
            await observer.notify(RunYielded(progress=state.progress(pricer)))
            raise HandedOff()
        try:
            step = await advance(step, ctx)
        except Interrupted as exc:
            step = Finish(interrupted(exc, ctx.config))
    return step.outcome


def interrupted(exc: Interrupted, config: LoopConfig) -> Outcome:
    """How a run that was cancelled or ran out of time ends: saying which."""
    if exc.reason is StopReason.CANCELLED:
        return Outcome(exc.reason, "spec.cancel was set")
    return Outcome(exc.reason, f"timeoutSeconds={config.limits.timeout_seconds:g} reached")


def _context(
    config: LoopConfig,
    *,
    model: ModelClient,
    tools: Mapping[str, Tool],
    observer: Observer,
    clock: Clock,
    pricer: Pricer,
    cancel: CancelSignal,
    state: RunState,
    elapsed_before: float,
    approvals: Approvals | None,
    allowance: Allowance | None,
) -> Context:
    """What every step of one run reads: its collaborators, the tool dispatcher and approval gate its
    limits configure, and its deadline (``timeoutSeconds`` less what earlier attempts used)."""
    dispatcher = Dispatcher(
        tools,
        clock=clock,
        concurrency=config.limits.tool_concurrency,
        timeout_seconds=config.limits.tool_timeout_seconds,
        max_result_chars=config.limits.max_tool_result_chars,
    )
    gate = ApprovalGate(
        approvals if approvals is not None else NoApprover(), clock, observer, config.approval_timeout_seconds
    )
    return Context(
        config=config,
        model=model,
        tools=tools,
        observer=observer,
        clock=clock,
        pricer=pricer,
        cancel=cancel,
        state=state,
        dispatcher=dispatcher,
        gate=gate,
        deadline=clock.monotonic() + config.limits.timeout_seconds - elapsed_before,
        allowance=allowance,
    )
