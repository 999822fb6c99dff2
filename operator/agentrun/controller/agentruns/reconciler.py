"""The AgentRun reconciler: one run from its watch event to its terminal status.

    resolve the Agent → resolve its SandboxTemplate → validate → resume → wait for Secrets → quota
    → queue → open tools → loop → finish

The phases are in phases.py; this module gives each run what its phases share (transcript store,
status writer, approvals, Events) and runs them in order, from the run as its watch event showed it
(run_objects.py). Whether the run must stop, and why, every part asks the run's one RunControl.
Every phase may end the run instead (an :class:`~phases.Ending`), and then only the finish phase
follows. Errors are translated here, once: an invalid spec or a tool that cannot start is an
outcome; a missing Secret keeps the run Pending; everything the model or tools do is the loop's
business; an unexpected error propagates to the supervisor, which starts the run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun import logs
from agentrun.api import status_patches
from agentrun.api.spec import AgentRunSpec, Approval, ResolvedRunSpec
from agentrun.api.status import AgentUsed, Phase
from agentrun.api.stops import StopReason
from agentrun.api.times import unix_time
from agentrun.controller.agentruns import phases
from agentrun.controller.agentruns import template_resolving as templates
from agentrun.controller.agentruns.agent_resolving import AgentWaiters, resolve_agent
from agentrun.controller.agentruns.children import ChildWatch, Parent, RunChildren, depth_of
from agentrun.controller.agentruns.holding import HeldModel, held_tools
from agentrun.controller.agentruns.observers import Fanout, LogObserver
from agentrun.controller.agentruns.phases import Ending
from agentrun.controller.agentruns.postgres_chunks import run_transcript_store
from agentrun.controller.agentruns.queueing import FairQueue, QueuedRun, Ticket
from agentrun.controller.agentruns.resuming import ResumePoint
from agentrun.controller.agentruns.run_control import RunControl
from agentrun.controller.agentruns.run_objects import InvalidRunSpec, RunObject
from agentrun.controller.agentruns.spec_approvals import SpecApprovals
from agentrun.controller.agentruns.status_writing import StatusWriter
from agentrun.controller.agentruns.tool_environment import RunToolEnvironment
from agentrun.controller.agentruns.transcript_storing import TranscriptStore
from agentrun.controller.kube_eventing import InvolvedRun, KubeEventSink, RunEvents
from agentrun.controller.quotas.admission import AdmittedSpec, Candidate
from agentrun.controller.quotas.allowance import RunAllowance
from agentrun.controller.quotas.control import Quotas
from agentrun.controller.quotas.limits import sandbox_use
from agentrun.kube.calling import KubeClient
from agentrun.kube.retrying import KubeRetryPolicy
from agentrun.loop.clocks import SystemClock
from agentrun.loop.errors import HandedOff
from agentrun.loop.events import RunFinished
from agentrun.loop.protocols import Observer
from agentrun.loop.reserving import first_request_floor
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun.model.access import ModelAccess
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings
from agentrun.stores.postgres import TranscriptDatabase
from agentrun.tracing.observing import TracingObserver

run_quota_logger = logging.getLogger("agentrun.quotas")

Log = logging.Logger | logging.LoggerAdapter[logging.Logger]


@dataclass
class _Run:
    """What the phases of one execution share."""

    ref: RunObject
    control: RunControl
    store: TranscriptStore
    writer: StatusWriter
    approvals: SpecApprovals
    events: RunEvents
    log: Log
    # spec.priority as the newest watch event shows it: it may change while the run waits for quota.
    priority: int = field(init=False)
    # The child runs its agent tools start (and its status.children).
    children: RunChildren | None = None
    # Quotas listed after this mark bind the run if new, whenever their events come (QuotaView.mark).
    quota_mark: int | None = None

    def __post_init__(self) -> None:
        self.priority = self.ref.priority

    @property
    def cancel(self) -> asyncio.Event:
        return self.control.cancel


@dataclass
class AgentRunReconciler:
    settings: Settings
    kube: KubeClient
    metrics: Metrics
    clients: ClientPool
    prices: PriceTable
    queue: FairQueue
    # The runs executing here (by uid): the watch handler feeds their spec.approvals.
    runs: dict[str, _Run] = field(default_factory=dict)
    tracer: Any = None  # an OpenTelemetry Tracer when AGENTRUN_OTEL_ENABLED is set (tracing/observing.py)
    # The namespaces' AgentRunQuotas (controller/quotas/); None: runs are not limited by quotas.
    quotas: Quotas | None = None
    # Runs waiting for their Agent (spec.agentRef) or SandboxTemplate (spec.sandbox.templateRef), woken
    # by those watches; watch events of child runs, routed to the agent tools waiting for them.
    agent_waiters: AgentWaiters = field(default_factory=AgentWaiters)
    template_waiters: templates.TemplateWaiters = field(default_factory=templates.TemplateWaiters)
    child_watch: ChildWatch = field(default_factory=ChildWatch)
    database: TranscriptDatabase | None = None  # the PostgreSQL transcript store, when configured

    def update_priority(self, uid: str, priority: int) -> None:
        """A new spec.priority: a run waiting for a slot moves within its namespace's line."""
        run = self.runs.get(uid)
        if run is not None:
            run.priority = priority
            if self.quotas is not None:  # or for quota room, in the same order
                self.quotas.gate.reprioritise(run.ref.namespace, uid, priority)
        self.queue.reprioritise(uid, priority)

    def update_approvals(self, uid: str, entries: Sequence[Approval]) -> None:
        """A new version of spec.approvals; only runs executing here care."""
        run = self.runs.get(uid)
        if run is not None:
            run.approvals.update(entries)

    async def reconcile(self, ref: RunObject, control: RunControl, *, log: Log) -> None:
        """Run it to its end. Raises HandedOff when the loop stopped at a checkpoint for another replica
        (`control.checkpoint`): the run has not ended, so nothing terminal is written and its quota
        admission is kept. Once `control` is silenced (stopped, or no longer held by this replica)
        nothing more is sent or written for the run."""
        run = self._prepare(ref, control, log)
        self.runs[ref.uid] = run
        try:
            with logs.bound_run(logs.RunLogContext(ref.namespace, ref.name, ref.uid)):
                await self._run_phases(run)
                await self._release_quotas(ref)
        finally:
            if run.children is not None:
                run.children.stop()
            await run.writer.close()
            self.runs.pop(ref.uid, None)

    def _prepare(self, ref: RunObject, control: RunControl, log: Log) -> _Run:
        """The run's transcript store, status writer, approvals and Events, each asking `control`."""
        retry = KubeRetryPolicy.from_settings(self.settings)
        writer = StatusWriter(
            self.kube,
            namespace=ref.namespace,
            name=ref.name,
            generation=ref.generation,
            newest_generation=lambda: control.generation,
            status=ref.status,
            stopping=control.silenced,
            transcript=lambda: store.reference(),
            progress_interval=self.settings.status_interval_seconds,
            retry=retry,
        )
        store = run_transcript_store(self.settings, self.kube, self.database, ref, control, writer)
        events = RunEvents(
            KubeEventSink(self.kube),
            InvolvedRun(ref.namespace, ref.name, ref.uid),
            instance=self.settings.replica_name,
        )
        run = _Run(ref, control, store, writer, SpecApprovals(ref.spec.approvals), events, log)
        run.quota_mark = self.quotas.view.mark(ref.namespace) if self.quotas is not None else None
        return run

    async def _run_phases(self, run: _Run) -> None:
        spec = await self._definition(run)
        if isinstance(spec, Ending):
            return await self._finish(run, spec)
        point = await phases.resume(run.store, run.ref.status, run.cancel)
        if isinstance(point, Ending):
            return await self._finish(run, point)
        # A run that has not started: an unknown model is refused before the first request. (One
        # that started under an earlier table goes on: its requests were answered.)
        if point.state is None and (unknown := phases.check_model(spec, self.prices)) is not None:
            return await self._finish(run, unknown)
        run.children = RunChildren(
            self.kube,
            Parent(run.ref.namespace, run.ref.name, run.ref.uid, depth_of(run.ref.labels)),
            self.child_watch,
            self.metrics,
            run.writer.write_fields,
            max_depth=self.settings.max_agent_depth,
            poll_seconds=self.settings.child_poll_seconds,
            summary_interval=self.settings.status_interval_seconds,
        )
        tool_env = RunToolEnvironment(
            self.kube,
            run.ref.namespace,
            run.ref.uid,
            spec.service_account_name,
            children=run.children,
            run_name=run.ref.name,
            resumed=point.state is not None,
            sandbox_started=lambda seconds, reason: self.metrics.sandbox_started(
                run.ref.namespace, seconds, reason=reason
            ),
            sandbox_idle_deleted=lambda: self.metrics.sandbox_idle_deleted(run.ref.namespace),
            sandbox_idle_seconds=self.settings.fault.sandbox_idle_seconds,
        )
        operator_key = self.settings.anthropic_api_key
        access = await phases.wait_for_secrets(
            spec,
            tool_env,
            operator_key=operator_key.get_secret_value() if operator_key else None,
            cancel=run.cancel,
            announce=run.writer.pending,
            retry_seconds=self.settings.secret_retry_seconds,
            progress=point.progress,
            operator_base_url=self.settings.anthropic_base_url,
        )
        if isinstance(access, Ending):
            return await self._finish(run, access)
        admission = await self._admit_to_quotas(run, spec, point)
        if isinstance(admission, Ending):
            return await self._finish(run, admission)
        spec = admission.spec
        ticket = await self._queue(run, point)
        if isinstance(ticket, Ending):
            return await self._finish(run, ticket)
        try:
            await self._open_tools_and_loop(run, spec, point, tool_env, access)
        finally:
            self.queue.leave(ticket)

    async def _definition(self, run: _Run) -> ResolvedRunSpec | Ending:
        """What the run executes: its spec as the watch event showed it parsed, its Agent's merged in
        (spec.agentRef), its sandbox's template read (spec.sandbox.templateRef), validated;
        InvalidSpec when the model refused the spec already."""
        own = run.ref.spec
        if isinstance(own, InvalidRunSpec):
            return Ending.of(StopReason.INVALID_SPEC, own.problem)
        merged = await self._resolve_agent(run, own)
        if isinstance(merged, Ending):
            return merged
        if "priority" not in own.model_fields_set:  # a run from an Agent waits with the Agent's priority
            run.priority = merged.priority
        spec = await self._resolve_template(run, merged)
        if isinstance(spec, Ending):
            return spec
        return phases.validate(spec) or spec

    async def _resolve_agent(self, run: _Run, spec: AgentRunSpec) -> AgentRunSpec | Ending:
        ref = run.ref

        async def record(agent: AgentUsed, agent_spec: Mapping[str, Any]) -> None:
            await run.writer.write(
                status_patches.agent_resolved(agent, agent_spec),
                Phase.PENDING,
                "AgentResolved",
                f"the run's spec comes from Agent {agent.name} (generation {agent.generation})",
            )

        return await resolve_agent(
            spec,
            ref.status,
            namespace=ref.namespace,
            source=self.kube,
            cancel=run.cancel,
            announce=run.writer.pending,
            record=record,
            waiters=self.agent_waiters,
            retry_seconds=self.settings.secret_retry_seconds,
        )

    async def _resolve_template(self, run: _Run, spec: AgentRunSpec) -> ResolvedRunSpec | Ending:
        return await templates.resolve_template(
            spec,
            run.ref.status,
            namespace=run.ref.namespace,
            source=self.kube,
            cancel=run.cancel,
            announce=run.writer.pending,
            record=templates.template_recorder(run.writer),
            waiters=self.template_waiters,
            retry_seconds=self.settings.secret_retry_seconds,
        )

    async def _admit_to_quotas(
        self, run: _Run, spec: ResolvedRunSpec, point: ResumePoint
    ) -> AdmittedSpec | Ending:
        if self.quotas is None:
            return AdmittedSpec(spec)
        ref = run.ref
        admission = await phases.admit_to_quotas(
            self.quotas.gate,
            _candidate(ref, spec, self.prices, run.priority),
            spec,
            status=ref.status,
            started=point.state is not None,
            cancel=run.cancel,
            announce=run.writer.quota_pending,
            progress=point.progress,
            mark=run.quota_mark,
        )
        if isinstance(admission, AdmittedSpec) and admission.record and admission.limits is not None:
            set_by_quotas = ", ".join(
                f"{k} {v}" for k, v in admission.limits.model_dump(by_alias=True, exclude_none=True).items()
            )
            await run.writer.write(
                status_patches.quota_limited(admission.limits),
                Phase.PENDING,
                "QuotaAdmitted",
                f"admitted by the namespace's AgentRunQuotas, which set {set_by_quotas}",
            )
        return admission

    async def _release_quotas(self, ref: RunObject) -> None:
        """The run finished: its place in concurrentRuns is free (GC does it if this fails)."""
        if self.quotas is None:
            return
        try:
            await self.quotas.gate.release(ref.namespace, ref.uid)
        except Exception as exc:  # the run is over either way; the quota reconciler retries
            run_quota_logger.warning(
                "could not release the quota admission of %s/%s (cleaned up later): %s",
                ref.namespace,
                ref.name,
                exc,
            )

    async def _queue(self, run: _Run, point: ResumePoint) -> Ticket | Ending:
        ref = run.ref

        async def announce(position: int) -> None:
            await run.writer.queued(position, phases.queued_message(position, self.queue))

        self.metrics.queue_entered(ref.namespace)
        try:
            return await phases.queue(
                self.queue,
                QueuedRun(ref.namespace, ref.name, ref.uid, ref.created, run.priority),
                run.cancel,
                announce=announce,
                interval=self.settings.status_interval_seconds,
                progress=point.progress,
            )
        finally:
            self.metrics.queue_left(ref.namespace)

    async def _open_tools_and_loop(
        self,
        run: _Run,
        spec: ResolvedRunSpec,
        point: ResumePoint,
        env: RunToolEnvironment,
        access: ModelAccess,
    ) -> None:
        ref, control = run.ref, run.control
        clock = SystemClock()
        metrics_observer = MetricsObserver(
            self.metrics, namespace=ref.namespace, started_monotonic=clock.monotonic(), clock=clock
        )
        tracing = self._tracing(ref, spec)
        tools_open = contextlib.AsyncExitStack()
        self.metrics.run_began(ref.uid, unix_time(ref.status.start_time))
        if point.state is None:
            self.metrics.run_started_at_depth(ref.namespace, depth_of(ref.labels))
        try:
            tools = await phases.open_run_tools(spec, env, tools_open)
            if isinstance(tools, Ending):
                return await self._finish(run, tools)
            model = self.clients.model(access, shard_key=ref.uid)
            allowance: RunAllowance | None = None
            if self.quotas is not None:
                allowance = self.quotas.allowance(ref.namespace, ref.name, ref.uid)
                await allowance.start()
            control.looping = True
            await phases.run_agent_loop(
                spec,
                run_id=ref.uid,
                # Neither asks or acts once this replica no longer holds the run.
                model=HeldModel(model, control.held),
                tools=held_tools(tools, control.held),
                observer=self._observers(run, metrics_observer, tracing),
                clock=clock,
                pricer=self.prices,
                cancel=control.cancel,
                approvals=run.approvals,
                resume_from=point,
                approval_timeout_seconds=self.settings.approval_timeout_seconds,
                context_windows=self.settings.context_windows,
                allowance=allowance,
                yield_at_checkpoint=control.checkpoint,
            )
            await env.remove_sandbox()  # the run ended; after a handoff or a stop the pod stays
        except HandedOff:
            run.log.info(
                "stopped at a checkpoint (%s): another replica resumes the run from there", control.why()
            )
            raise
        finally:
            control.looping = False
            await tools_open.aclose()
            await env.close()
            metrics_observer.release_approvals()
            if tracing is not None:
                tracing.close()
            self.metrics.run_ended(ref.uid)

    def _tracing(self, ref: RunObject, spec: AgentRunSpec) -> TracingObserver | None:
        if self.tracer is None:
            return None
        return TracingObserver.of(self.tracer, ref.namespace, ref.name, ref.uid, spec.model)

    def _observers(self, run: _Run, metrics: MetricsObserver, tracing: TracingObserver | None) -> Observer:
        """Transcript first, then status: status only ever references persisted chunks, and the pair
        stays together (the terminal patch is the run's last word, so it is the last write)."""
        observers: list[Observer] = [
            Fanout(run.store, run.writer),
            *([run.children] if run.children is not None else []),
            metrics,
            run.events,
            LogObserver(run.log),
            *([tracing] if tracing is not None else []),
        ]
        return Fanout(*observers, terminal_last=True)

    async def _finish(self, run: _Run, ending: Ending) -> None:
        """The finish phase of a run that ends before its loop: counted, an Event, then the status."""
        self.metrics.run_finished(run.ref.namespace, ending.outcome.stop_reason)
        finished = RunFinished(outcome=ending.outcome, progress=ending.progress)
        # The Event goes first: the terminal status patch is the run's last word.
        await run.events.notify(finished)
        await run.writer.notify(finished)


def _candidate(ref: RunObject, spec: ResolvedRunSpec, prices: PriceTable, priority: int) -> Candidate:
    """The run as the quota line sees it, with the least room its first request needs and its sandbox."""
    floor = first_request_floor(spec.model.name, spec.system_prompt, spec.task, spec.model.max_tokens, prices)
    return Candidate(
        ref.namespace,
        ref.name,
        ref.uid,
        ref.created,
        priority,
        need_tokens=floor.tokens,
        need_cost_usd=floor.cost_usd or Decimal(0),
        sandbox=sandbox_use(spec),
    )
