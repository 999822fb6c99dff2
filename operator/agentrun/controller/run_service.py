"""The run service: turns one AgentRun object into one loop execution. Handlers stay thin.

Errors are translated here, once: invalid specs become InvalidSpec outcomes, a missing Secret
keeps the run Pending until it appears, everything the model or tools do is the loop's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pydantic

from agentrun import logs
from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.controller.kube_eventing import InvolvedRun, KubeEventSink, RunEvents
from agentrun.controller.kubeapi import KubeAPI
from agentrun.controller.resuming import NO_PROGRESS, find_resume_point
from agentrun.controller.spec_approvals import SpecApprovals
from agentrun.controller.status_writing import StatusWriter
from agentrun.controller.tool_environment import RunToolEnvironment
from agentrun.controller.transcript_storing import RunIdentity, TranscriptStore
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.events import ApprovalDecided, ApprovalRequested, Event, ModelRequestFinished, RunFinished
from agentrun.loop.running import run_loop
from agentrun.metrics.observing import Metrics, MetricsObserver
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings
from agentrun.tools.registry import (
    InvalidToolSpec,
    SecretMissing,
    ToolStartError,
    check_tools,
    open_tools,
    secret_uses,
)
from agentrun.tracing.observing import TracingObserver

logger = logging.getLogger(__name__)


def describe_validation_error(exc: pydantic.ValidationError, prefix: str = "spec") -> str:
    """One line per problem, each naming the field as a user would write it in YAML."""
    lines = []
    for error in exc.errors():
        path = prefix
        for part in error["loc"]:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        lines.append(f"{path}: {error['msg']}")
    return "; ".join(lines)


class Fanout:
    """Delivers each event to every observer in order; the status writer comes first.

    With `terminal_last`, the first observer hears RunFinished after the others: the terminal status
    patch is the run's last word (once it is stored, nothing reruns or resumes the run), so metrics,
    Events and logs are recorded before it.
    """

    def __init__(self, *observers: Any, terminal_last: bool = False) -> None:
        self._observers = observers
        self._terminal_last = terminal_last

    async def notify(self, event: Event) -> None:
        observers = self._observers
        if self._terminal_last and isinstance(event, RunFinished) and observers:
            observers = (*observers[1:], observers[0])
        for observer in observers:
            await observer.notify(event)


class LogObserver:
    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        self._log = log

    async def notify(self, event: Event) -> None:
        context = logs.current_run()
        if context is not None and isinstance(getattr(event, "iteration", None), int):
            context.iteration = getattr(event, "iteration", 0)
        match event:
            case ModelRequestFinished(iteration=i, outcome=outcome, duration_seconds=s, usage=u):
                self._log.info(
                    "iteration %d: model request %s in %.2fs (in=%d out=%d)",
                    i,
                    outcome,
                    s,
                    u.input_tokens,
                    u.output_tokens,
                )
            case RunFinished(outcome=outcome, progress=p):
                self._log.info(
                    "finished: %s after %d iterations (%s)",
                    outcome.stop_reason.value,
                    p.iterations,
                    outcome.message,
                )
            case ApprovalRequested(tool_name=tool, tool_use_id=call_id):
                self._log.info("tool call %s (%s) is waiting for approval in spec.approvals", tool, call_id)
            case ApprovalDecided(tool_name=tool, tool_use_id=call_id, approved=ok, by=by, reason=why):
                self._log.info(
                    "tool call %s (%s) %s by %s: %s",
                    tool,
                    call_id,
                    "approved" if ok else "denied",
                    by or "the operator",
                    why or "no reason given",
                )
            case _:
                pass


@dataclass
class RunRef:
    namespace: str
    name: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]


@dataclass
class RunService:
    settings: Settings
    kube: KubeAPI
    metrics: Metrics
    clients: ClientPool
    prices: PriceTable
    slots: asyncio.Semaphore
    cancels: dict[str, asyncio.Event] = field(default_factory=dict)
    # The transcript store of each executing run (by uid): checkpoints are persisted there first.
    stores: dict[str, TranscriptStore] = field(default_factory=dict)
    # spec.approvals of each executing run (by uid), fed by the watch handler.
    approvals: dict[str, SpecApprovals] = field(default_factory=dict)
    # Kubernetes Events per executing run (by uid), also used when a run finishes before its loop.
    run_events: dict[str, RunEvents] = field(default_factory=dict)
    # An OpenTelemetry Tracer when AGENTRUN_OTEL_ENABLED is set (tracing/observing.py).
    tracer: Any = None

    def request_cancel(self, uid: str) -> None:
        self.cancels.setdefault(uid, asyncio.Event()).set()

    def update_approvals(self, uid: str, entries: list[Any]) -> None:
        """A new version of spec.approvals; only runs executing here care."""
        approvals = self.approvals.get(uid)
        if approvals is not None:
            approvals.update(entries)

    async def execute(
        self,
        run: RunRef,
        *,
        stopping: Callable[[], bool],
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        store = TranscriptStore(
            self.kube.core,
            RunIdentity(run.namespace, run.name, run.uid),
            storage=self.settings.transcript_storage,
            flush_after_seconds=self.settings.transcript_flush_seconds,
            stopping=stopping,
        )
        self.stores[run.uid] = store
        writer = StatusWriter(
            self.kube,
            namespace=run.namespace,
            name=run.name,
            generation=run.generation,
            status=run.status,
            stopping=stopping,
            transcript=store.reference,
            progress_interval=self.settings.status_interval_seconds,
        )
        cancel = self.cancels.setdefault(run.uid, asyncio.Event())
        self.approvals[run.uid] = SpecApprovals(run.spec.get("approvals") or [])
        if run.spec.get("cancel"):
            cancel.set()
        self.run_events[run.uid] = RunEvents(
            KubeEventSink(self.kube), InvolvedRun(run.namespace, run.name, run.uid)
        )
        try:
            with logs.bound_run(logs.RunLogContext(run.namespace, run.name, run.uid)):
                await self._execute(run, writer, cancel, log)
        finally:
            await writer.close()
            self.cancels.pop(run.uid, None)
            self.stores.pop(run.uid, None)
            self.approvals.pop(run.uid, None)
            self.run_events.pop(run.uid, None)

    async def _execute(
        self,
        run: RunRef,
        writer: StatusWriter,
        cancel: asyncio.Event,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        try:
            spec = AgentRunSpec.model_validate(run.spec)
            check_tools(spec)
        except pydantic.ValidationError as exc:
            await self._finish_early(run, writer, StopReason.INVALID_SPEC, describe_validation_error(exc))
            return
        except InvalidToolSpec as exc:
            await self._finish_early(run, writer, StopReason.INVALID_SPEC, str(exc))
            return
        resume = await find_resume_point(self.stores[run.uid], run.status)
        if resume.outcome is not None:
            # The run ended before the restart but its terminal status was not written yet.
            await self._finish_early(
                run,
                writer,
                resume.outcome.stop_reason,
                resume.outcome.message,
                condition_reason=resume.outcome.condition_reason,
                outcome=resume.outcome,
                progress=resume.progress,
            )
            return
        if cancel.is_set():
            await self._finish_early(
                run,
                writer,
                StopReason.CANCELLED,
                "spec.cancel was set before the run started"
                if resume.state is None
                else "spec.cancel was set while the operator was away",
                progress=resume.progress,
            )
            return
        tool_env = RunToolEnvironment(self.kube, run.namespace, run.uid, spec.service_account_name)
        api_key = await self._api_key(spec, run, writer, cancel, tool_env)
        if api_key is None:
            if cancel.is_set():
                await self._finish_early(
                    run,
                    writer,
                    StopReason.CANCELLED,
                    "spec.cancel was set while pending",
                    progress=resume.progress,
                )
            return
        if self.slots.locked():
            await writer.pending(
                "Queued", f"waiting for one of {self.settings.max_concurrent_runs} run slots"
            )
        self.metrics.runs_queued.inc()
        try:
            slot = await self._acquire_slot(cancel)
        finally:
            self.metrics.runs_queued.dec()
        if not slot:
            await self._finish_early(
                run,
                writer,
                StopReason.CANCELLED,
                "spec.cancel was set while queued",
                progress=resume.progress,
            )
            return
        tracing: TracingObserver | None = None
        clock = SystemClock()
        metrics_observer = MetricsObserver(
            self.metrics, namespace=run.namespace, started_monotonic=clock.monotonic(), clock=clock
        )
        tools_open = contextlib.AsyncExitStack()
        try:
            self.metrics.runs_active.inc()
            self.metrics.run_began(run.uid, _timestamp(run.status.get("startTime")))
            try:
                tools = await tools_open.enter_async_context(open_tools(spec, tool_env))
            except (InvalidToolSpec, SecretMissing) as exc:
                await self._finish_early(run, writer, StopReason.INVALID_SPEC, str(exc))
                return
            except ToolStartError as exc:
                await self._finish_early(
                    run,
                    writer,
                    StopReason.FATAL_TOOL_ERROR,
                    str(exc),
                    condition_reason="ToolServerUnavailable",
                )
                return
            # Transcript first, then status: status only ever references persisted chunks, and the
            # pair stays together (the terminal patch is the run's last word, so it is the last write).
            observers: list[Any] = [
                Fanout(self.stores[run.uid], writer),
                metrics_observer,
                self.run_events[run.uid],
                LogObserver(log),
            ]
            if self.tracer is not None:
                tracing = TracingObserver(
                    self.tracer, namespace=run.namespace, name=run.name, uid=run.uid, model=spec.model.name
                )
                observers.append(tracing)
            model = self.clients.model(
                api_key=api_key,
                base_url=spec.model.base_url or self.settings.anthropic_base_url,
                shard_key=run.uid,
            )
            await run_loop(
                LoopConfig.from_spec(
                    spec, run_id=run.uid, approval_timeout_seconds=self.settings.approval_timeout_seconds
                ),
                model=model,
                tools=tools,
                observer=Fanout(*observers, terminal_last=True),
                clock=clock,
                pricer=self.prices,
                cancel=cancel,
                approvals=self.approvals[run.uid],
                state=resume.state,
                elapsed_before=resume.elapsed_before,
            )
        finally:
            await tools_open.aclose()
            metrics_observer.release_approvals()
            if tracing is not None:
                tracing.close()
            self.metrics.run_ended(run.uid)
            self.metrics.runs_active.dec()
            self.slots.release()

    async def _api_key(
        self,
        spec: AgentRunSpec,
        run: RunRef,
        writer: StatusWriter,
        cancel: asyncio.Event,
        tool_env: RunToolEnvironment,
    ) -> str | None:
        """Wait, Pending, until the key and the tools' Secrets exist; Secrets created later unblock it."""
        ref = spec.model.api_key_secret_ref
        announced: tuple[str, str] | None = None
        while not cancel.is_set():
            key: str | None = None
            if ref is None:
                key = (
                    self.settings.anthropic_api_key.get_secret_value()
                    if self.settings.anthropic_api_key
                    else None
                )
                reason, message = (
                    "APIKeyMissing",
                    ("no spec.model.apiKeySecretRef and the operator has no ANTHROPIC_API_KEY"),
                )
            else:
                key = await self.kube.read_secret_key(run.namespace, ref.name, ref.key) or None
                reason, message = (
                    "SecretNotFound",
                    (
                        f"Secret {run.namespace}/{ref.name} with key {ref.key!r} "
                        "(spec.model.apiKeySecretRef) does not exist yet; the run starts once it does"
                    ),
                )
            if key is not None:
                missing = await tool_env.first_missing(secret_uses(spec))
                if missing is None:
                    return key
                reason, message = "SecretNotFound", str(missing)
            if announced != (reason, message):
                await writer.pending(reason, message)
                announced = (reason, message)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cancel.wait(), timeout=self.settings.secret_retry_seconds)
        return None

    async def _acquire_slot(self, cancel: asyncio.Event) -> bool:
        """A run slot, or False when the run is cancelled while it waits (Pending/Queued)."""
        acquire = asyncio.ensure_future(self.slots.acquire())
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
            self.slots.release()
            return False
        return got

    async def _finish_early(
        self,
        run: RunRef,
        writer: StatusWriter,
        reason: StopReason,
        message: str,
        *,
        condition_reason: str | None = None,
        outcome: Outcome | None = None,
        progress: Progress = NO_PROGRESS,
    ) -> None:
        outcome = outcome or Outcome(reason, message, condition_reason=condition_reason)
        self.metrics.runs_finished.labels(
            run.namespace, reason.value, "succeeded" if reason.succeeded else "failed"
        ).inc()
        finished = RunFinished(outcome=outcome, progress=progress)
        # The Event goes first: the terminal status patch is the run's last word.
        events = self.run_events.get(run.uid)
        if events is not None:
            await events.notify(finished)
        await writer.notify(finished)


def _timestamp(value: Any) -> float | None:
    """status.startTime as Unix time, so a resumed run's age counts from its real start."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
