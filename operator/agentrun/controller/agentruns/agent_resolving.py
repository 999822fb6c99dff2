"""The resolve_agent phase: a run with spec.agentRef gets its Agent's spec, once, before anything else.

The Agent's spec is recorded in the run's status (status.agentSpec) together with its identity
(status.agent) in one write, and a resumed run uses that record: an Agent edited or deleted later
never changes a run that already started from it. Until the Agent exists the run is Pending
(reason AgentNotFound); it looks again when an Agent event arrives (:class:`AgentWaiters`) and
every ``retry_seconds`` in case an event was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pydantic

from agentrun.agents import AgentSpecConflict, resolve
from agentrun.api.agent import AgentSpec
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, AgentUsed
from agentrun.api.stops import StopReason
from agentrun.api.traces import Progress
from agentrun.controller.agentruns.phases import Ending, describe_validation_error, validate
from agentrun.controller.agentruns.resuming import NO_PROGRESS
from agentrun.kube.objects import ObjectMeta

__all__ = ["AgentSource", "AgentWaiters", "agent_not_found", "resolve_agent", "wait_until_found"]

AGENT_NOT_FOUND = "AgentNotFound"


class AgentSource(Protocol):
    """Where Agents are read from: the API server, or the manifest of `agentrun run`."""

    async def get_agent(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


@dataclass
class AgentWaiters:
    """Runs waiting for an Agent to exist, woken by the Agent watch (controller/kopf_registry.py)."""

    _events: dict[tuple[str, str], set[asyncio.Event]] = field(default_factory=dict)

    def changed(self, namespace: str, name: str) -> None:
        for event in self._events.get((namespace, name), ()):
            event.set()

    @contextlib.contextmanager
    def waiting(self, namespace: str, name: str) -> Any:
        event = asyncio.Event()
        key = (namespace, name)
        self._events.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            events = self._events.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[key]


def agent_not_found(name: str, namespace: str) -> str:
    return f"Agent {name} not found in namespace {namespace}; the run starts when it is created"


async def resolve_agent(
    spec: AgentRunSpec,
    status: AgentRunStatus,
    *,
    namespace: str,
    source: AgentSource,
    cancel: asyncio.Event,
    announce: Callable[[str, str], Awaitable[None]],
    record: Callable[[AgentUsed, Mapping[str, Any]], Awaitable[None]],
    waiters: AgentWaiters | None = None,
    retry_seconds: float = 5.0,
    progress: Progress = NO_PROGRESS,
) -> AgentRunSpec | Ending:
    """The spec the run executes: its own without agentRef, else its Agent's overridden by it.

    A run that asks for more than its Agent allows ends InvalidSpec naming the field, both values
    and the Agent; an Agent's spec, or an effective spec, the run's validation refuses ends it
    InvalidSpec with the Agent and its generation first; a cancel while waiting for the Agent ends it
    Cancelled.
    """
    if spec.agent_ref is None:
        return spec
    name = spec.agent_ref.name
    if status.agent_spec is not None:
        agent_spec: Mapping[str, Any] = status.agent_spec
        generation = status.agent.generation if status.agent is not None else None
    else:
        found = await _wait_for_agent(
            name,
            namespace=namespace,
            source=source,
            cancel=cancel,
            announce=announce,
            waiters=waiters,
            retry_seconds=retry_seconds,
        )
        if found is None:
            return Ending.of(
                StopReason.CANCELLED, "spec.cancel was set while waiting for the Agent", progress=progress
            )
        meta = ObjectMeta.of(found)
        agent_spec, generation = found.get("spec") or {}, meta.generation
        await record(AgentUsed(name=name, uid=meta.uid, generation=meta.generation), agent_spec)
    try:
        effective = resolve(AgentSpec.model_validate(agent_spec), spec, name)
    except AgentSpecConflict as exc:
        return Ending.of(StopReason.INVALID_SPEC, str(exc), progress=progress)
    except pydantic.ValidationError as exc:
        refused: Ending | None = Ending.of(StopReason.INVALID_SPEC, describe_validation_error(exc))
    else:
        # Validated here (the reconciler validates again, cheaply) so that a refusal names the Agent and
        # the generation it comes from: the fields at fault are most often the Agent's, not the run's.
        refused = validate(effective)
    if refused is not None:
        message = f"Agent {name} generation {generation}: {refused.outcome.message}"
        return Ending.of(StopReason.INVALID_SPEC, message, progress=progress)
    return effective


async def _wait_for_agent(
    name: str,
    *,
    namespace: str,
    source: AgentSource,
    cancel: asyncio.Event,
    announce: Callable[[str, str], Awaitable[None]],
    waiters: AgentWaiters | None,
    retry_seconds: float,
) -> Mapping[str, Any] | None:
    """The Agent's object once it exists; None when the run is cancelled first."""
    return await wait_until_found(
        lambda: source.get_agent(namespace, name),
        (namespace, name),
        cancel=cancel,
        announce=lambda: announce(AGENT_NOT_FOUND, agent_not_found(name, namespace)),
        waiters=waiters,
        retry_seconds=retry_seconds,
    )


async def wait_until_found(
    fetch: Callable[[], Awaitable[Mapping[str, Any] | None]],
    key: tuple[str, str],
    *,
    cancel: asyncio.Event,
    announce: Callable[[], Awaitable[None]],
    waiters: AgentWaiters | None,
    retry_seconds: float,
) -> Mapping[str, Any] | None:
    """The object ``fetch`` reads once it exists, ``announce``d (once) while it does not; None when
    the run is cancelled first. Woken by ``waiters`` under ``key`` (namespace, name), and every
    ``retry_seconds`` in case a watch event was missed."""
    with (waiters or AgentWaiters()).waiting(*key) as woken:
        announced = False
        while not cancel.is_set():
            woken.clear()
            found = await fetch()
            if found is not None:
                return found
            if not announced:
                await announce()
                announced = True
            wakes = [asyncio.ensure_future(cancel.wait()), asyncio.ensure_future(woken.wait())]
            try:
                await asyncio.wait(wakes, timeout=retry_seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wake in wakes:
                    wake.cancel()
    return None
