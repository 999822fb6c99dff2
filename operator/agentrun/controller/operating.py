"""Running the operator: Kopf, the metrics endpoint and the AgentRun reconciler in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from typing import Any

import kopf
from kopf._core.engines.peering import Identity  # not re-exported by kopf
from prometheus_client import CollectorRegistry

from agentrun.controller.agentruns.handling import AgentRunHandler
from agentrun.controller.agentruns.queueing import FairQueue
from agentrun.controller.agentruns.reconciler import AgentRunReconciler
from agentrun.controller.agents.control import AgentValidator
from agentrun.controller.collector import young_generation_threshold
from agentrun.controller.kopf_registry import build_registry
from agentrun.controller.quotas.control import Quotas
from agentrun.controller.replicas.detached import DetachedMembership
from agentrun.controller.replicas.faults import install_loop_stall
from agentrun.controller.replicas.ownership import Standalone
from agentrun.controller.schedules.control import ScheduleController
from agentrun.kube.crd_waiting import connect_checked, wait_for_crd
from agentrun.kube.retrying import KubeRetryPolicy
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.serving import keep_beating, start_health_server, start_metrics_server
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings
from agentrun.tracing.observing import configure_tracer_provider, tracer_of

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


async def _operate(settings: Settings, *, stop_flag: asyncio.Event | None, **kopf_kwargs: Any) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    kube, crd_served, scanning = await connect_checked(settings.namespaces)
    clients = ClientPool(timeout_seconds=settings.model_timeout_seconds)
    provider = configure_tracer_provider(os.environ) if settings.otel_enabled else None
    quotas = Quotas(
        kube,
        metrics,
        identity=settings.replica_name,
        retry=KubeRetryPolicy.from_settings(settings),
        announce_interval=settings.status_interval_seconds,
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
    )
    ready = asyncio.Event()  # Kopf raises it once it serves the resources: GET /readyz on the metrics port
    metrics_runner = await start_metrics_server(
        registry, settings.bind_address, settings.metrics_port, ready=ready
    )
    logger.info("serving metrics on %s:%d/metrics", settings.bind_address, settings.metrics_port)
    # Said once the operator is up, not before: a startup failure stays one line on stderr.
    logger.info(
        "garbage collection of the youngest generation after %d new objects", settings.gc_young_threshold
    )
    heartbeat = asyncio.create_task(keep_beating(metrics, settings.heartbeat_seconds))
    # Several replicas share the runs when they have a namespace for their Leases (controller/replicas/);
    # alone, this one owns every run. The membership renews from a thread of its own (replicas/detached.py):
    # a busy event loop must not make a replica fence itself.
    membership = DetachedMembership(settings, metrics) if settings.lease_namespace else None
    handler = AgentRunHandler(
        reconciler,
        membership if membership is not None else Standalone(),
        handoff=membership,
    )
    # AgentSchedules: the owner of a schedule's uid creates its runs (controller/schedules/).
    schedules = ScheduleController(kube, metrics, handler.ownership, instance=settings.replica_name)
    # Agents: the owner of an Agent's uid validates it and writes its Ready condition (controller/agents/).
    agents = AgentValidator(kube, handler.ownership)
    # Ledger entries of runs that finished or were deleted without releasing them (controller/quotas/).
    collecting = asyncio.create_task(
        quotas.keep_collecting(lambda: set(reconciler.runs), handler.ownership.owns)
    )
    membership_task = asyncio.create_task(membership.run()) if membership is not None else None
    # Tests only (unset, the default: nothing installed): SIGUSR1 blocks this event loop, a stuck operator.
    stall_injection = install_loop_stall(settings.fault.stall_loop_seconds)
    try:
        if not crd_served:
            stop = stop_flag or asyncio.Event()
            # Alive while waiting: the liveness probe must not restart a pod that only waits for its CRD.
            waiting = await start_health_server(settings.bind_address, settings.health_port)
            try:
                if not await wait_for_crd(kube, settings.namespaces, stop):
                    return
            finally:
                await waiting.cleanup()
        await kopf.operator(
            registry=build_registry(handler, quotas, schedules, agents),
            settings=kopf_settings(scanning=scanning),
            standalone=True,
            # Without an identity Kopf derives one from the login name, which a container running as a UID
            # with no passwd entry (the chart's 65532, OpenShift's arbitrary UIDs) does not have: it raised
            # KeyError at start. The replica name is this process's one identity: in its group's Leases, its
            # quota reservations' holder, its Events' reportingInstance, and here.
            identity=Identity(settings.replica_name),
            clusterwide=not settings.namespaces,
            namespaces=list(settings.namespaces),
            liveness_endpoint=f"http://{settings.bind_address}:{settings.health_port}/healthz",
            stop_flag=stop_flag,
            ready_flag=ready,
            **kopf_kwargs,
        )
    finally:
        if stall_injection is not None:
            stall_injection()
        # Runs stop before the Lease goes: the others take them over only after they stopped here.
        await schedules.close()
        await agents.close()
        await handler.close()
        for task in (heartbeat, collecting, membership_task):
            if task is None:
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if membership is not None:
            try:
                await membership.leave()
            except Exception as exc:  # the Lease then expires: the others wait one lease duration longer
                logger.warning("could not delete this replica's Lease on shutdown: %s", exc)
        await metrics_runner.cleanup()
        if provider is not None:
            provider.shutdown()
        await clients.close()
        await kube.close()
