"""The life of one AgentRun as named phases: admit, resume, wait for Secrets, queue, open tools, loop, finish.

Each phase returns what the next one needs, or an :class:`Ending`: the run ends there, and the
finish phase writes why. The reconciler (reconciler.py) runs them in that order for the operator;
`agentrun run` (cli/local.py) runs admit, open tools and loop, and prints the finish phase's
status instead of writing it. Nothing here knows Kopf: phases get what they use as arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.controller.agentruns.resuming import NO_PROGRESS, ResumePoint, find_resume_point
from agentrun.controller.agentruns.tool_environment import RunToolEnvironment
from agentrun.controller.agentruns.transcript_storing import TranscriptStore
from agentrun.loop.approving import Approvals
from agentrun.loop.config import LoopConfig
from agentrun.loop.protocols import Clock, ModelClient, Observer, Pricer, Tool
from agentrun.loop.running import run_loop
from agentrun.tools.registry import (
    InvalidToolSpec,
    SecretMissing,
    ToolStartError,
    check_tools,
    open_tools,
    secret_uses,
)

__all__ = [
    "Ending",
    "admit",
    "describe_validation_error",
    "open_run_tools",
    "queue",
    "resume",
    "run_agent_loop",
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


def admit(raw_spec: Mapping[str, Any]) -> AgentRunSpec | Ending:
    """The spec as the loop will use it, or InvalidSpec naming every field that is wrong.

    The CRD schema refuses most bad input at the API server; what it cannot express (tool
    configuration, cross-field rules) ends the run here, before anything is spent.
    """
    try:
        spec = AgentRunSpec.model_validate(raw_spec)
        check_tools(spec)
    except pydantic.ValidationError as exc:
        return Ending.of(StopReason.INVALID_SPEC, describe_validation_error(exc))
    except InvalidToolSpec as exc:
        return Ending.of(StopReason.INVALID_SPEC, str(exc))
    return spec


async def resume(
    store: TranscriptStore, status: Mapping[str, Any], cancel: asyncio.Event
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


@dataclass(frozen=True)
class Waiting:
    """Why the run cannot start yet (status.conditions reason and message while Pending)."""

    reason: str
    message: str


async def wait_for_secrets(
    spec: AgentRunSpec,
    tool_env: RunToolEnvironment,
    *,
    operator_key: str | None,
    cancel: asyncio.Event,
    announce: Callable[[str, str], Awaitable[None]],
    retry_seconds: float,
    progress: Progress = NO_PROGRESS,
) -> str | Ending:
    """The API key, once it and every Secret the tools name exist; Pending (announced once) until then.

    Secrets created later unblock the run by themselves: they are looked for again every
    ``retry_seconds``. A cancel while waiting ends the run Cancelled.
    """
    announced: Waiting | None = None
    while not cancel.is_set():
        found = await secrets_ready(spec, tool_env, operator_key=operator_key)
        if isinstance(found, str):
            return found
        if found != announced:
            await announce(found.reason, found.message)
            announced = found
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancel.wait(), timeout=retry_seconds)
    return Ending.of(StopReason.CANCELLED, "spec.cancel was set while pending", progress=progress)


async def secrets_ready(
    spec: AgentRunSpec, tool_env: RunToolEnvironment, *, operator_key: str | None
) -> str | Waiting:
    """One look: the API key, or what is missing."""
    ref = spec.model.api_key_secret_ref
    if ref is None:
        if not operator_key:
            return Waiting(
                "APIKeyMissing", "no spec.model.apiKeySecretRef and the operator has no ANTHROPIC_API_KEY"
            )
        key = operator_key
    else:
        found = await tool_env.read_secret(ref.name, ref.key)
        if not found:
            return Waiting(
                "SecretNotFound",
                f"Secret {tool_env.namespace}/{ref.name} with key {ref.key!r} "
                "(spec.model.apiKeySecretRef) does not exist yet; the run starts once it does",
            )
        key = found
    missing = await tool_env.first_missing(secret_uses(spec))
    if missing is not None:
        return Waiting("SecretNotFound", str(missing))
    return key


async def queue(
    slots: asyncio.Semaphore,
    cancel: asyncio.Event,
    *,
    announce: Callable[[str, str], Awaitable[None]],
    capacity: int,
    progress: Progress = NO_PROGRESS,
) -> Ending | None:
    """A run slot (the caller releases it), or Cancelled when the run is cancelled while it waits."""
    if slots.locked():
        await announce("Queued", f"waiting for one of {capacity} run slots")
    acquire = asyncio.ensure_future(slots.acquire())
    stop = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (acquire, stop):
            if not task.done():
                task.cancel()
        await asyncio.gather(acquire, stop, return_exceptions=True)
    got = acquire.done() and not acquire.cancelled() and acquire.exception() is None
    if got and cancel.is_set():
        slots.release()
        got = False
    if not got:
        return Ending.of(StopReason.CANCELLED, "spec.cancel was set while queued", progress=progress)
    return None


async def open_run_tools(
    spec: AgentRunSpec, tool_env: RunToolEnvironment, stack: contextlib.AsyncExitStack
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
) -> Outcome:
    """The loop itself (agentrun.loop): it ends with RunFinished, which the observers write."""
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
    )
