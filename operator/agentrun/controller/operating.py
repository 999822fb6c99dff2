"""Running the operator: Kopf, the metrics endpoint and the AgentRun reconciler in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kopf
from kopf._core.engines.peering import Identity  # not re-exported by kopf
from prometheus_client import CollectorRegistry

from agentrun.api import LABEL_SCHEDULE
from agentrun.controller.agentruns.handling import AgentRunHandler
from agentrun.controller.agentruns.queueing import FairQueue
from agentrun.controller.agentruns.reconciler import AgentRunReconciler
from agentrun.controller.agentruns.tool_environment import kube_connection
from agentrun.controller.agentruns.watching import RunWatch
from agentrun.controller.agents.control import AgentValidator
from agentrun.controller.agents.pools import WarmPools
from agentrun.controller.agents.templates import TemplateEvents
from agentrun.controller.collector import young_generation_threshold
from agentrun.controller.kopf_registry import build_registry
from agentrun.controller.quotas.control import Quotas
from agentrun.controller.quotas.database_writing import open_quota_ledgers
from agentrun.controller.replicas.detached import DetachedMembership
from agentrun.controller.replicas.faults import install_loop_stall
from agentrun.controller.replicas.ownership import Standalone
from agentrun.controller.schedules.control import ScheduleController
from agentrun.controller.transcript_rows import TranscriptRows, open_transcript_database
from agentrun.kube.calling import KubeClient, connect
from agentrun.kube.crd_waiting import connect_checked, wait_for_crd
from agentrun.kube.retrying import KubeRetryPolicy
from agentrun.kube.scanning import is_pattern
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.serving import keep_beating, start_health_server, start_metrics_server
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings
from agentrun.stores.postgres import TranscriptDatabase
from agentrun.stores.quota_ledgers import QuotaLedgerDatabase
from agentrun.tracing.observing import configure_tracer_provider, tracer_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """Kopf builds a deep copy of every object on every watch event to diff it for change handlers.

    We register none (runs start from watch events; controller/agentruns/supervising.py), so the copy is
    never used, and it was a few percent of the operator's CPU at scale (bench/RESULTS.md).
    """

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> Any:
        return {}

    def fetch(self, *, body: kopf.Body) -> None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


def kopf_settings(*, scanning: bool = True) -> kopf.OperatorSettings:
    """``scanning`` False: Kopf neither lists nor watches CRDs and Namespaces (kube/scanning.py)."""
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = not scanning
    # No handler needs a finalizer (runs are tasks started from watch events,
    # controller/agentruns/supervising.py); naming the one earlier builds put on runs lets Kopf take
    # it off them.
    settings.persistence.finalizer = "agentrun.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="agentrun.dev")
    settings.persistence.diffbase_storage = NoDiffBase()
    # Kubernetes Events are posted explicitly; handler log lines stay in the logs.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    return settings


async def operate(settings: Settings, *, stop_flag: asyncio.Event | None = None, **kopf_kwargs: Any) -> None:
    with young_generation_threshold(settings.gc_young_threshold):
        await _operate(settings, stop_flag=stop_flag, **kopf_kwargs)


class _BackgroundTasks:
    """Tasks that run beside Kopf until the operator stops: the heartbeat, the quota ledger's collector,
    the replica membership. :meth:`cancel` cancels and awaits them in the order they started."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(work))

    async def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass(frozen=True)
class _Controllers:
    """What Kopf's registry dispatches watch events to (controller/kopf_registry.py)."""

    runs: AgentRunHandler
    quotas: Quotas
    schedules: ScheduleController
    agents: AgentValidator
    templates: TemplateEvents


async def _operate(settings: Settings, *, stop_flag: asyncio.Event | None, **kopf_kwargs: Any) -> None:
    """Starts each piece, then serves Kopf until it stops.

    Each piece registers its own cleanup on one exit stack as it starts, so the operator tears down in
    the reverse order of its start (also when a later piece fails to start): the runs stop before the
    Lease goes, since the other replicas take them over only after they stopped here, and the
    Kubernetes client goes last.
    """
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    async with contextlib.AsyncExitStack() as stack:
        kube, crd_served, scanning = await connect_checked(settings.namespaces)
        stack.push_async_callback(kube.close)
        # AGENTRUN_TRANSCRIPT_STORAGE=postgres: connected and its table created before any run resumes.
        database = await open_transcript_database(settings)
        if database is not None:
            stack.push_async_callback(database.close)
        # AGENTRUN_QUOTA_LEDGER=postgres: likewise, before any run is admitted.
        ledgers = await open_quota_ledgers(settings)
        if ledgers is not None:
            stack.push_async_callback(ledgers.close)
        clients = ClientPool(timeout_seconds=settings.model_timeout_seconds, client=settings.model_client)
        stack.push_async_callback(clients.close)
        provider = configure_tracer_provider(os.environ) if settings.otel_enabled else None
        if provider is not None:
            stack.callback(provider.shutdown)
        quotas, reconciler = _reconciler(settings, kube, metrics, clients, provider, database, ledgers)
        ready = asyncio.Event()  # GET /readyz on the metrics port: Kopf serves its kinds, the runs listed
        await _serve_metrics(stack, settings, registry, ready)
        controllers = _start_controllers(stack, settings, metrics, kube, quotas, reconciler)
        # Tests only (unset by default: nothing installed): SIGUSR1 blocks this event loop, a stuck operator.
        stall_injection = install_loop_stall(settings.fault.stall_loop_seconds)
        if stall_injection is not None:
            stack.callback(stall_injection)
        if not crd_served and not await _wait_for_crd_alive(settings, kube, stop_flag or asyncio.Event()):
            return
        run_watch, kopf_ready = await _start_run_watch(stack, settings, controllers, ready)
        await kopf.operator(
            registry=build_registry(
                controllers.runs,
                controllers.quotas,
                controllers.schedules,
                controllers.agents,
                agent_waiters=reconciler.agent_waiters,
                templates=controllers.templates,
                run_watch=run_watch,
            ),
            settings=kopf_settings(scanning=scanning),
            standalone=True,
            # Without one Kopf derives an identity from the login name, which a UID with no passwd entry (the
            # chart's 65532, OpenShift's) lacks: KeyError at start. The replica name is this process's one
            # identity: in its group's Leases, its quota reservations, its Events' reportingInstance, here.
            identity=Identity(settings.replica_name),
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            liveness_endpoint=f"http://{settings.bind_address}:{settings.health_port}/healthz",
            stop_flag=stop_flag,
            ready_flag=kopf_ready,
            **kopf_kwargs,
        )


def _reconciler(
    settings: Settings,
    kube: KubeClient,
    metrics: Metrics,
    clients: ClientPool,
    provider: TracerProvider | None,
    database: TranscriptDatabase | None,
    ledgers: QuotaLedgerDatabase | None,
) -> tuple[Quotas, AgentRunReconciler]:
    """The reconciler of AgentRuns, with the quotas that admit their runs and their model requests."""
    quotas = Quotas(
        kube,
        metrics,
        identity=settings.replica_name,
        retry=KubeRetryPolicy.from_settings(settings),
        announce_interval=settings.status_interval_seconds,
        ledgers=ledgers,
    )
    reconciler = AgentRunReconciler(
        settings=settings,
        kube=kube,
        metrics=metrics,
        clients=clients,
        prices=PriceTable.load(settings.price_file),
        queue=FairQueue(settings.max_concurrent_runs),
        tracer=tracer_of(provider) if provider is not None else None,
        quotas=quotas,
        database=database,
    )
    return quotas, reconciler


async def _serve_metrics(
    stack: contextlib.AsyncExitStack, settings: Settings, registry: CollectorRegistry, ready: asyncio.Event
) -> None:
    metrics_runner = await start_metrics_server(
        registry, settings.bind_address, settings.metrics_port, ready=ready
    )
    stack.push_async_callback(metrics_runner.cleanup)
    logger.info("serving metrics on %s:%d/metrics", settings.bind_address, settings.metrics_port)
    # Said once the operator is up, not before: a startup failure stays one line on stderr.
    logger.info(
        "garbage collection of the youngest generation after %d new objects", settings.gc_young_threshold
    )


def _start_controllers(
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    metrics: Metrics,
    kube: KubeClient,
    quotas: Quotas,
    reconciler: AgentRunReconciler,
) -> _Controllers:
    """The run handler, the schedule and Agent controllers, with the replica membership that says which
    objects this replica owns and the background tasks beside them."""
    # Several replicas share the runs when they have a namespace for their Leases (controller/replicas/);
    # alone, this one owns every run. The membership renews from a thread of its own (replicas/detached.py):
    # a busy event loop must not make a replica fence itself.
    membership = DetachedMembership(settings, metrics) if settings.lease_namespace else None
    if membership is not None:
        stack.push_async_callback(_leave, membership)
    background = _BackgroundTasks()
    stack.push_async_callback(background.cancel)
    background.start(keep_beating(metrics, settings.heartbeat_seconds))
    # The PostgreSQL store's rows of deleted runs (controller/transcript_rows.py).
    rows = TranscriptRows(reconciler.database, kube, settings.namespaces) if reconciler.database else None
    if rows is not None:
        stack.push_async_callback(rows.close)
        background.start(rows.keep_sweeping())
    handler = AgentRunHandler(
        reconciler,
        kube=kube,
        child_watch=reconciler.child_watch,
        metrics=metrics,
        settings=settings,
        ownership=membership if membership is not None else Standalone(),
        handoff=membership,
        deleted=rows.deleted if rows is not None else None,
        quota_line=quotas.gate.saw_elsewhere,
    )
    stack.push_async_callback(handler.close)
    # AgentSchedules: the owner of a schedule's uid creates its runs (controller/schedules/).
    schedules = ScheduleController(kube, metrics, handler.ownership, instance=settings.replica_name)
    # Agents: the owner of an Agent's uid validates it and writes its Ready condition (controller/agents/).
    # Their warm sandbox pools too (controller/agents/pools.py), refilled by a short poll.
    pools = WarmPools(kube_connection(kube.api_client.configuration), handler.ownership)
    stack.push_async_callback(pools.close)
    background.start(pools.keep_filling())
    agents = AgentValidator(kube, handler.ownership, pools=pools)
    stack.push_async_callback(agents.close)
    stack.push_async_callback(schedules.close)  # closed first: the schedules, then the Agents, then the runs
    # Ledger entries of runs that finished or were deleted without releasing them (controller/quotas/).
    background.start(quotas.keep_collecting(lambda: set(reconciler.runs), handler.ownership.owns))
    if quotas.ledgers is not None:  # every replica's ledger changes, told by PostgreSQL (quotas/control.py)
        stack.push_async_callback(quotas.mirror.close)
        background.start(quotas.keep_listening())
    if membership is not None:
        background.start(membership.run())
    # SandboxTemplates: runs waiting for theirs are woken, and the Agents naming one keep their pools in step.
    templates = TemplateEvents(pools.templates, reconciler.template_waiters, agents)
    return _Controllers(runs=handler, quotas=quotas, schedules=schedules, agents=agents, templates=templates)


async def _start_run_watch(
    stack: contextlib.AsyncExitStack, settings: Settings, controllers: _Controllers, ready: asyncio.Event
) -> tuple[RunWatch | None, asyncio.Event]:
    """The operator's own AgentRun watch, on a client of its own (its connection never queues behind
    the runs' writes), and the event Kopf sets once it serves its kinds: ``ready`` follows once the runs
    are listed too. No watch with a namespace pattern, which Kopf resolves (controller/kopf_registry.py)."""
    patterns = [namespace for namespace in settings.namespaces if is_pattern(namespace)]
    if patterns:
        logger.info("AgentRuns are watched through Kopf (namespace patterns: %s)", ", ".join(patterns))
        return None, ready
    logger.info("AgentRuns are watched by the operator's own watch")
    kube = await connect()
    stack.push_async_callback(kube.close)

    async def deliver(kind: str | None, body: Mapping[str, Any]) -> None:
        await controllers.runs.observe(kind, body)
        if LABEL_SCHEDULE in ((body.get("metadata") or {}).get("labels") or {}):
            controllers.schedules.run_changed(body)

    watch = RunWatch(kube, settings.namespaces, deliver)
    watch.start()
    stack.push_async_callback(watch.stop)
    kopf_ready = asyncio.Event()
    readiness = asyncio.create_task(_ready_when(ready, kopf_ready, watch.listed))
    stack.push_async_callback(_cancelled, readiness)
    return watch, kopf_ready


async def _ready_when(ready: asyncio.Event, *conditions: asyncio.Event) -> None:
    for condition in conditions:
        await condition.wait()
    ready.set()


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _leave(membership: DetachedMembership) -> None:
    try:
        await membership.leave()
    except Exception as exc:  # the Lease then expires: the others wait one lease duration longer
        logger.warning("could not delete this replica's Lease on shutdown: %s", exc)


async def _wait_for_crd_alive(settings: Settings, kube: KubeClient, stop: asyncio.Event) -> bool:
    """Waits for the AgentRun CRD (False: stopped first), serving /healthz meanwhile: the liveness probe
    must not restart a pod that only waits for its CRD."""
    waiting = await start_health_server(settings.bind_address, settings.health_port)
    try:
        return await wait_for_crd(kube, settings.namespaces, stop)
    finally:
        await waiting.cleanup()
