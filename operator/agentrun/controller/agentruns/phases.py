"""The life of one AgentRun as named phases: validate, resume, wait for Secrets, quota, queue, open
tools, loop, finish.

Each phase returns what the next one needs, or an :class:`Ending`: the run ends there, and the
finish phase writes why. The reconciler (reconciler.py) runs them in that order for the operator;
`agentrun run` (cli/local.py) runs validate, open tools and loop, and prints the finish phase's
status instead of writing it. Nothing here knows Kopf: phases get what they use as arguments, the
spec already parsed into its model where the run arrived (run_objects.py, or the manifest's file).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.controller.agentruns.credential_reading import Waiting, model_access
from agentrun.controller.agentruns.queueing import FairQueue, QueuedRun, Ticket
from agentrun.controller.agentruns.resuming import NO_PROGRESS, ResumePoint, find_resume_point
from agentrun.controller.agentruns.tool_environment import RunToolEnvironment
from agentrun.controller.agentruns.transcript_storing import TranscriptStore
from agentrun.controller.quotas.admission import (
    AdmissionGate,
    AdmittedSpec,
    Announce,
    Candidate,
    QuotaRefusal,
)
from agentrun.loop.approving import Approvals
from agentrun.loop.config import LoopConfig
from agentrun.loop.protocols import Allowance, Clock, ModelClient, Observer, Pricer, Tool
from agentrun.loop.running import run_loop
from agentrun.model.access import ModelAccess, endpoint_problem
from agentrun.model.pricing import PriceTable
from agentrun.quotas.per_run import PerRunViolation
from agentrun.tools.registry import (
    InvalidToolSpec,
    SecretMissing,
    ToolStartError,
    check_tools,
    mount_uses,
    open_tools,
    secret_uses,
)

__all__ = [
    "Ending",
    "admit_to_quotas",
    "describe_validation_error",
    "open_run_tools",
    "parse_spec",
    "queue",
    "queued_message",
    "read_spec",
    "resume",
    "run_agent_loop",
    "validate",
    "wait_for_secrets",
]


@dataclass(frozen=True)
class Ending:
    """The run ends in this phase; ``progress`` is what it had spent before (a resumed run's)."""

    outcome: Outcome
    progress: Progress = NO_PROGRESS

    @classmethod
    def of(
        cls,
        reason: StopReason,
        message: str,
        *,
        condition_reason: str | None = None,
        progress: Progress = NO_PROGRESS,
    ) -> Ending:
        return cls(Outcome(reason, message, condition_reason=condition_reason), progress)


def describe_validation_error(exc: pydantic.ValidationError, prefix: str = "spec") -> str:
    """One line per problem, each naming the field as a user would write it in YAML."""
    lines = []
    for error in exc.errors():
        path = prefix
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        lines.append(f"{path}: {error['msg']}")
    return "; ".join(lines)


def parse_spec(raw: Mapping[str, Any]) -> AgentRunSpec | Ending:
    """The spec as its model, or InvalidSpec naming every field pydantic refuses (one line each).

    Called where a spec arrives (the watch event, the manifest's file): the CRD schema is generated
    from the same model, so what the API server admitted parses; what it cannot say (a usable JSON
    Schema in output.schema) ends the run here, before anything is spent.
    """
    try:
        return AgentRunSpec.model_validate(raw)
    except pydantic.ValidationError as exc:
        return Ending.of(StopReason.INVALID_SPEC, describe_validation_error(exc))


def validate(spec: AgentRunSpec) -> Ending | None:
    """The validate phase: InvalidSpec for what neither the CRD schema nor the model can check alone
    (tool configuration, the tools requiredTools and toolChoice name); None when the run may go on."""
    try:
        check_tools(spec)
    except InvalidToolSpec as exc:
        return Ending.of(StopReason.INVALID_SPEC, str(exc))
    return None


def read_spec(raw: Mapping[str, Any]) -> AgentRunSpec | Ending:
    """A whole spec from a manifest, parsed and validated: what `agentrun run` and an Agent's check use."""
    spec = parse_spec(raw)
    if isinstance(spec, Ending):
        return spec
    return validate(spec) or spec


#: Where the docs say how to add a price (an entry of AGENTRUN_PRICE_FILE).
PRICES_DOC = "docs/operating.md#prices"


def check_model(spec: AgentRunSpec, prices: PriceTable, env: Mapping[str, str] = os.environ) -> Ending | None:
    """InvalidSpec for a model name the operator's price table does not know, or a provider region
    nothing names (the spec nor the operator's environment), before any request.

    Why here and for every run: a misspelt name used to get three answers, late (QuotaExceeded under
    a cost quota, InvalidSpec with costBudgetUSD, else one request and ModelNotFound). The price table
    (built-in, plus AGENTRUN_PRICE_FILE) is the operator's list of models. A run with its own
    ``baseURL`` calls a gateway that names its own models: its name is not checked, unless
    ``costBudgetUSD`` needs its price.
    """
    if (unreachable := endpoint_problem(spec.model, env)) is not None:
        return Ending.of(StopReason.INVALID_SPEC, unreachable)
    name = spec.model.name
    if prices.knows(name):
        return None
    add = f"add a price for it with AGENTRUN_PRICE_FILE ({PRICES_DOC})"
    if spec.model.base_url is None:
        known = ", ".join(prices.names())
        message = (
            f'spec.model.name: model "{name}" is not in the operator\'s price table (known: {known}); '
            f"check the name, or {add}"
        )
    elif spec.limits.cost_budget_usd is not None:
        message = (
            f'spec.model.name: model "{name}" has no price in the operator\'s price table, which '
            f"limits.costBudgetUSD needs; {add}, or drop the budget"
        )
    else:
        return None
    return Ending.of(StopReason.INVALID_SPEC, message)


async def resume(
    store: TranscriptStore, status: AgentRunStatus, cancel: asyncio.Event
) -> ResumePoint | Ending:
    """Where the run continues from: its last persisted checkpoint (nothing, for a new run).

    A transcript that already records the run's end finishes it from there (the operator stopped
    between the last chunk and the terminal status); a cancel that came while nobody ran it ends it.
    """
    point = await find_resume_point(store, status)
    if point.outcome is not None:
        return Ending(point.outcome, point.progress)
    if cancel.is_set():
        started = point.state is not None
        why = (
            "spec.cancel was set while the operator was away"
            if started
            else "spec.cancel was set before the run started"
        )
        return Ending.of(StopReason.CANCELLED, why, progress=point.progress)
    return point


async def wait_for_secrets(
    spec: AgentRunSpec,
    tool_env: RunToolEnvironment,
    *,
    operator_key: str | None,
    cancel: asyncio.Event,
    announce: Callable[[str, str], Awaitable[None]],
    retry_seconds: float,
    progress: Progress = NO_PROGRESS,
    operator_base_url: str | None = None,
) -> ModelAccess | Ending:
    """How to reach the model, once its credentials and every Secret the tools name exist; Pending
    (announced once) until then.

    Secrets created later unblock the run by themselves: they are looked for again every
    ``retry_seconds``. A cancel while waiting ends the run Cancelled.
    """
    announced: Waiting | None = None
    while not cancel.is_set():
        found = await secrets_ready(
            spec,
            tool_env,
            operator_key=operator_key,
            operator_base_url=operator_base_url,
        )
        if isinstance(found, ModelAccess):
            return found
        if found != announced:
            await announce(found.reason, found.message)
            announced = found
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancel.wait(), timeout=retry_seconds)
    return Ending.of(StopReason.CANCELLED, "spec.cancel was set while pending", progress=progress)


async def secrets_ready(
    spec: AgentRunSpec,
    tool_env: RunToolEnvironment,
    *,
    operator_key: str | None,
    operator_base_url: str | None = None,
    env: Mapping[str, str] = os.environ,
) -> ModelAccess | Waiting:
    """One look: the model's access, or what is missing."""
    access = await model_access(
        spec.model,
        tool_env,
        operator_key=operator_key,
        operator_base_url=operator_base_url,
        env=env,
    )
    if isinstance(access, Waiting):
        return access
    missing = await tool_env.first_missing(secret_uses(spec))
    if missing is not None:
        return Waiting("SecretNotFound", str(missing))
    unmountable = await tool_env.first_missing_mount(mount_uses(spec))
    if unmountable is not None:
        return Waiting(unmountable.reason, str(unmountable))
    return access


async def admit_to_quotas(
    gate: AdmissionGate,
    run: Candidate,
    spec: ResolvedRunSpec,
    *,
    status: AgentRunStatus,
    started: bool,
    cancel: asyncio.Event,
    announce: Announce,
    progress: Progress = NO_PROGRESS,
    mark: int | None = None,
) -> AdmittedSpec | Ending:
    """Room in every AgentRunQuota of the namespace (controller/quotas/admission.py); Pending
    (reason QuotaExceeded) until there is. A run above a quota's per-run maximum ends InvalidSpec
    naming the quota and the field; one whose first request alone passes a quota's whole limit ends
    QuotaExceeded (it would wait forever); a cancel while waiting ends it Cancelled."""
    admitted = await gate.admit_run(
        run, spec, status, started=started, cancel=cancel, announce=announce, mark=mark
    )
    if admitted is None:
        return Ending.of(
            StopReason.CANCELLED, "spec.cancel was set while waiting for quota", progress=progress
        )
    if isinstance(admitted, PerRunViolation):
        return Ending.of(StopReason.INVALID_SPEC, admitted.message, progress=progress)
    if isinstance(admitted, QuotaRefusal):
        return Ending.of(StopReason.QUOTA_EXCEEDED, admitted.message, progress=progress)
    return admitted


async def queue(
    slots: FairQueue,
    run: QueuedRun,
    cancel: asyncio.Event,
    *,
    announce: Callable[[int], Awaitable[None]],
    interval: float,
    progress: Progress = NO_PROGRESS,
    clock: Callable[[], float] = time.monotonic,
) -> Ticket | Ending:
    """A ticket holding a run slot (the caller leaves it), or Cancelled when cancelled while waiting.

    A run that waits announces its position (1 = next) at once, then again whenever it changed,
    but at most once every ``interval`` seconds: with hundreds waiting, every released slot moves
    every position, and a status write per run per release would be the operator's busiest work.
    """
    ticket = slots.enter(run)
    if ticket.holding:
        return ticket
    # No awaits between deciding and leaving: a slot granted must be kept or left, never lost.
    stop = asyncio.ensure_future(cancel.wait())
    stop.add_done_callback(lambda _: ticket.changed.set())
    written: int | None = None
    last = 0.0
    try:
        while not ticket.holding and not cancel.is_set():
            ticket.changed.clear()
            position = ticket.position
            due: float | None = None
            if position is not None and position != written:
                due = 0.0 if written is None else last + interval - clock()
                if due <= 0:
                    await announce(position)
                    written, last = position, clock()
                    continue
            ticket.listening = due is None  # until then, the position is read when due
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(due):
                    await ticket.changed.wait()
    finally:
        stop.cancel()
        if not ticket.holding or cancel.is_set():
            slots.leave(ticket)
    if ticket.holding:
        return ticket
    return Ending.of(StopReason.CANCELLED, "spec.cancel was set while queued", progress=progress)


def queued_message(position: int, slots: FairQueue) -> str:
    """The Pending condition's message while a run waits for a slot."""
    busy = slots.busy
    return f"position {position} in the operator's queue ({busy} run slot{'s' if busy != 1 else ''} busy)"


async def open_run_tools(
    spec: ResolvedRunSpec, tool_env: RunToolEnvironment, stack: contextlib.AsyncExitStack
) -> Mapping[str, Tool] | Ending:
    """The run's tools, open until ``stack`` closes; a tool that cannot start ends the run."""
    try:
        return await stack.enter_async_context(open_tools(spec, tool_env))
    except (InvalidToolSpec, SecretMissing) as exc:
        return Ending.of(StopReason.INVALID_SPEC, str(exc))
    except ToolStartError as exc:
        return Ending.of(StopReason.FATAL_TOOL_ERROR, str(exc), condition_reason="ToolServerUnavailable")


async def run_agent_loop(
    spec: AgentRunSpec,
    *,
    run_id: str,
    model: ModelClient,
    tools: Mapping[str, Tool],
    observer: Observer,
    clock: Clock,
    pricer: Pricer,
    cancel: asyncio.Event,
    approvals: Approvals | None = None,
    resume_from: ResumePoint | None = None,
    approval_timeout_seconds: float | None = None,
    context_windows: Sequence[tuple[str, int]] = (),
    allowance: Allowance | None = None,
    yield_at_checkpoint: asyncio.Event | None = None,
) -> Outcome:
    """The loop itself (agentrun.loop): it ends with RunFinished, which the observers write, or
    raises HandedOff when `yield_at_checkpoint` stopped it at a checkpoint for another replica."""
    config = (
        LoopConfig.from_spec(spec, run_id=run_id, context_windows=context_windows)
        if approval_timeout_seconds is None
        else LoopConfig.from_spec(
            spec,
            run_id=run_id,
            approval_timeout_seconds=approval_timeout_seconds,
            context_windows=context_windows,
        )
    )
    return await run_loop(
        config,
        model=model,
        tools=tools,
        observer=observer,
        clock=clock,
        pricer=pricer,
        cancel=cancel,
        approvals=approvals,
        state=resume_from.state if resume_from is not None else None,
        elapsed_before=resume_from.elapsed_before if resume_from is not None else 0.0,
        allowance=allowance,
        yield_at_checkpoint=yield_at_checkpoint,
    )
