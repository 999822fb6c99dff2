"""The AgentRun reconciler: one run from its watch event to its terminal status.

    admit → resume → wait for Secrets → queue → open tools → loop → finish

The phases are in phases.py; this module gives each run what its phases share (its transcript
store, its status writer, its cancel signal, its approvals, its Events) and runs them in order.
Every phase may end the run instead (an :class:`~phases.Ending`), and then only the finish phase
follows. Errors are translated here, once: an invalid spec or a tool that cannot start is an
outcome; a missing Secret keeps the run Pending; everything the model or tools do is the loop's
business; an unexpected error propagates to the supervisor, which starts the run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agentrun import logs
from agentrun.api.spec import AgentRunSpec
from agentrun.controller.agentruns import phases
from agentrun.controller.agentruns.observers import Fanout, LogObserver
from agentrun.controller.agentruns.phases import Ending
from agentrun.controller.agentruns.resuming import ResumePoint
from agentrun.controller.agentruns.spec_approvals import SpecApprovals
from agentrun.controller.agentruns.status_writing import StatusWriter
from agentrun.controller.agentruns.tool_environment import RunToolEnvironment
from agentrun.controller.agentruns.transcript_storing import RunIdentity, TranscriptStore
from agentrun.controller.kube_eventing import InvolvedRun, KubeEventSink, RunEvents
from agentrun.kube.calling import KubeClient
from agentrun.kube.retrying import RetryPolicy
from agentrun.loop.clocks import SystemClock
from agentrun.loop.events import RunFinished
from agentrun.loop.protocols import Observer
from agentrun.metrics.observing import Metrics, MetricsObserver
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings
from agentrun.tracing.observing import TracingObserver

Log = logging.Logger | logging.LoggerAdapter[logging.Logger]


@dataclass(frozen=True)
class RunRef:
    """The run as one watch event showed it: plain data, a stable snapshot for one execution."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]


@dataclass
class _Run:
    """What the phases of one execution share."""

    ref: RunRef
    store: TranscriptStore
    writer: StatusWriter
    cancel: asyncio.Event
    approvals: SpecApprovals
    events: RunEvents
    log: Log


@dataclass
class AgentRunReconciler:
    settings: Settings
    kube: KubeClient
    metrics: Metrics
    clients: ClientPool
    prices: PriceTable
    slots: asyncio.Semaphore
    # A cancel request per run (by uid), also for runs not started yet: they find it when they do.
    cancels: dict[str, asyncio.Event] = field(default_factory=dict)
    # The runs executing here (by uid): the watch handler feeds their spec.approvals.
    runs: dict[str, _Run] = field(default_factory=dict)
    # An OpenTelemetry Tracer when AGENTRUN_OTEL_ENABLED is set (tracing/observing.py).
    tracer: Any = None

    def request_cancel(self, uid: str) -> None:
        self.cancels.setdefault(uid, asyncio.Event()).set()

    def forget(self, uid: str) -> None:
        """The run is deleted: a cancel request for it has nobody left to reach."""
        self.cancels.pop(uid, None)

    def update_approvals(self, uid: str, entries: list[Any]) -> None:
        """A new version of spec.approvals; only runs executing here care."""
        run = self.runs.get(uid)
        if run is not None:
            run.approvals.update(entries)

    async def reconcile(self, ref: RunRef, *, stopping: Callable[[], bool], log: Log) -> None:
        retry = RetryPolicy.from_settings(self.settings)
        store = TranscriptStore(
            self.kube,
            RunIdentity(ref.namespace, ref.name, ref.uid),
            storage=self.settings.transcript_storage,
            flush_after_seconds=self.settings.transcript_flush_seconds,
            stopping=stopping,
            retry=retry,
        )
        writer = StatusWriter(
            self.kube,
            namespace=ref.namespace,
            name=ref.name,
            generation=ref.generation,
            status=ref.status,
            stopping=stopping,
            transcript=store.reference,
            progress_interval=self.settings.status_interval_seconds,
            retry=retry,
        )
        cancel = self.cancels.setdefault(ref.uid, asyncio.Event())
        if ref.spec.get("cancel"):
            cancel.set()
        run = _Run(
            ref,
            store,
            writer,
            cancel,
            SpecApprovals(ref.spec.get("approvals") or []),
            RunEvents(KubeEventSink(self.kube), InvolvedRun(ref.namespace, ref.name, ref.uid)),
            log,
        )
        self.runs[ref.uid] = run
        try:
            with logs.bound_run(logs.RunLogContext(ref.namespace, ref.name, ref.uid)):
                await self._run_phases(run)
        finally:
            await writer.close()
            self.cancels.pop(ref.uid, None)
            self.runs.pop(ref.uid, None)

    async def _run_phases(self, run: _Run) -> None:
        spec = phases.admit(run.ref.spec)
        if isinstance(spec, Ending):
            return await self._finish(run, spec)
        point = await phases.resume(run.store, run.ref.status, run.cancel)
        if isinstance(point, Ending):
            return await self._finish(run, point)
        tool_env = RunToolEnvironment(self.kube, run.ref.namespace, run.ref.uid, spec.service_account_name)
        operator_key = self.settings.anthropic_api_key
        api_key = await phases.wait_for_secrets(
            spec,
            tool_env,
            operator_key=operator_key.get_secret_value() if operator_key else None,
            cancel=run.cancel,
            announce=run.writer.pending,
            retry_seconds=self.settings.secret_retry_seconds,
            progress=point.progress,
        )
        if isinstance(api_key, Ending):
            return await self._finish(run, api_key)
        self.metrics.runs_queued.inc()
        try:
            queued = await phases.queue(
                self.slots,
                run.cancel,
                announce=run.writer.pending,
                capacity=self.settings.max_concurrent_runs,
                progress=point.progress,
            )
        finally:
            self.metrics.runs_queued.dec()
        if isinstance(queued, Ending):
            return await self._finish(run, queued)
        try:
            await self._open_tools_and_loop(run, spec, point, tool_env, api_key)
        finally:
            self.slots.release()

    async def _open_tools_and_loop(
        self, run: _Run, spec: AgentRunSpec, point: ResumePoint, tool_env: RunToolEnvironment, api_key: str
    ) -> None:
        ref = run.ref
        clock = SystemClock()
        metrics_observer = MetricsObserver(
            self.metrics, namespace=ref.namespace, started_monotonic=clock.monotonic(), clock=clock
        )
        tracing: TracingObserver | None = None
        tools_open = contextlib.AsyncExitStack()
        self.metrics.runs_active.inc()
        self.metrics.run_began(ref.uid, _timestamp(ref.status.get("startTime")))
        try:
            tools = await phases.open_run_tools(spec, tool_env, tools_open)
            if isinstance(tools, Ending):
                return await self._finish(run, tools)
            # Transcript first, then status: status only ever references persisted chunks, and the
            # pair stays together (the terminal patch is the run's last word, so it is the last write).
            observers: list[Observer] = [
                Fanout(run.store, run.writer),
                metrics_observer,
                run.events,
                LogObserver(run.log),
            ]
            if self.tracer is not None:
                tracing = TracingObserver(
                    self.tracer, namespace=ref.namespace, name=ref.name, uid=ref.uid, model=spec.model.name
                )
                observers.append(tracing)
            model = self.clients.model(
                api_key=api_key,
                base_url=spec.model.base_url or self.settings.anthropic_base_url,
                shard_key=ref.uid,
            )
            await phases.run_agent_loop(
                spec,
                run_id=ref.uid,
                model=model,
                tools=tools,
                observer=Fanout(*observers, terminal_last=True),
                clock=clock,
                pricer=self.prices,
                cancel=run.cancel,
                approvals=run.approvals,
                resume_from=point,
                approval_timeout_seconds=self.settings.approval_timeout_seconds,
                context_windows=self.settings.context_windows,
            )
        finally:
            await tools_open.aclose()
            metrics_observer.release_approvals()
            if tracing is not None:
                tracing.close()
            self.metrics.run_ended(ref.uid)
            self.metrics.runs_active.dec()

    async def _finish(self, run: _Run, ending: Ending) -> None:
        """The finish phase of a run that ends before its loop: counted, an Event, then the status."""
        reason = ending.outcome.stop_reason
        self.metrics.runs_finished.labels(
            run.ref.namespace, reason.value, "succeeded" if reason.succeeded else "failed"
        ).inc()
        finished = RunFinished(outcome=ending.outcome, progress=ending.progress)
        # The Event goes first: the terminal status patch is the run's last word.
        await run.events.notify(finished)
        await run.writer.notify(finished)


def _timestamp(value: Any) -> float | None:
    """status.startTime as Unix time, so a resumed run's age counts from its real start."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
