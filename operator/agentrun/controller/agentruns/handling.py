"""What one watch event of an AgentRun sets in motion; the watch (watching.py, or Kopf's handler with
namespace patterns) only passes the event here.

An unfinished run gets its execution started (supervising.py) or, when deleted, stopped; a cancel
request or a new spec.approvals reaches the executing run within that one event, no polling; a
finished run gets its TTL deletion scheduled and a later spec change marked observed.

With several replicas only the owner of a run does any of that, and a change of ownership is applied
by the Rebalancer (controller/replicas/rebalancing.py), which this handler tells of every run it sees.
Each execution gets the run's RunControl (run_control.py); with replicas it also holds a ``Held``, so
that before every model request, tool call and write the run checks that this replica's membership has
not lapsed since it started: a fence reaches this event loop as a callback, and a step may be ahead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pydantic

from agentrun.api.spec import Approval
from agentrun.api.status import Phase
from agentrun.controller.agentruns.children import ChildWatch, cancel_children, delete_children
from agentrun.controller.agentruns.phases import describe_validation_error
from agentrun.controller.agentruns.run_control import RunControl, StopCause
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.controller.agentruns.status_writing import mark_observed
from agentrun.controller.agentruns.supervising import RunSupervisor
from agentrun.controller.agentruns.ttl_reaping import TTLReaper
from agentrun.controller.quotas.lines import Elsewhere
from agentrun.controller.replicas.ownership import Held, Ownership, Standalone
from agentrun.controller.replicas.rebalancing import FinishedRun, Handoff, Rebalancer
from agentrun.kube.calling import KubeClient
from agentrun.kube.objects import ObjectMeta
from agentrun.metrics.definitions import Metrics
from agentrun.settings import Settings

run_logger = logging.getLogger("agentrun.run")
logger = logging.getLogger(__name__)


class RunExecutor(Protocol):
    """The reconciler (reconciler.py), as the handler uses it."""

    async def reconcile(self, ref: RunObject, control: RunControl, *, log: logging.Logger) -> None: ...

    def update_priority(self, uid: str, priority: int) -> None: ...

    def update_approvals(self, uid: str, entries: Sequence[Approval]) -> None: ...


class AgentRunHandler:
    def __init__(
        self,
        executor: RunExecutor,
        *,
        kube: KubeClient,
        child_watch: ChildWatch,
        metrics: Metrics,
        settings: Settings,
        ownership: Ownership | None = None,
        handoff: Handoff | None = None,
        deleted: Callable[[str], None] | None = None,
        quota_line: Callable[[str, str, Elsewhere | None], None] | None = None,
    ) -> None:
        self.executor = executor
        # Told of every run's wait for quota (None: it does not wait): one line per namespace across
        # the replicas, whichever of them owns each run (controller/quotas/lines.py).
        self._quota_line = quota_line
        # Told the uid of each deleted run this replica owns: the PostgreSQL transcript store removes its
        # rows (one replica is enough; the sweep covers a run whose owner was away).
        self._deleted = deleted
        self.kube = kube
        self.child_watch = child_watch
        self.metrics = metrics
        self.replica = settings.replica_name
        self.ownership: Ownership = ownership if ownership is not None else Standalone()
        self.supervisor = RunSupervisor(self._execute)
        self.reaper = TTLReaper(kube, settings.default_ttl_seconds_after_finished)
        self.rebalancer: Rebalancer[RunObject] = Rebalancer(
            self.ownership,
            handoff,
            self.supervisor,
            self.reaper,
            metrics,
            replica=self.replica,
            grace=settings.handoff_grace_seconds,
        )
        # Held only with a membership to lapse: alone, every run is this replica's for good.
        self._replicated = handoff is not None
        # Parents whose cancel or deletion was passed on to their children (by uid), and the tasks doing it.
        self._passed_on: set[str] = set()
        self._passing: set[asyncio.Task[None]] = set()

    async def _execute(self, run: RunObject, control: RunControl) -> None:
        if self._replicated:
            control.hold(Held(self.ownership, run.uid, lambda: control.stop(StopCause.FENCED)))
        await self.executor.reconcile(run, control, log=run_logger)

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event (None: from the initial listing): the run parsed, then acted on."""
        uid = (body.get("metadata") or {}).get("uid")
        try:
            run = RunObject.parse(body, self.rebalancer.unfinished.get(uid) if uid else None)
        except pydantic.ValidationError as exc:  # the CRD's schema admits no such status
            meta = ObjectMeta.of(body)
            logger.error(
                "AgentRun %s/%s: its status does not match the CRD's schema, the run is left alone: %s",
                meta.namespace,
                meta.name,
                describe_validation_error(exc, "status"),
            )
            return
        self.child_watch.observe(event_type, run)
        await self._observe(event_type, run)

    async def _observe(self, event_type: str | None, run: RunObject) -> None:
        uid = run.uid
        if event_type != "DELETED" and not run.finished and uid:
            self.rebalancer.saw_unfinished(uid, run)
        if self._quota_line is not None and uid:
            self._quota_line(run.namespace, uid, _waiting_for_quota(event_type, run))
        owned = self.rebalancer.owns(uid)
        if owned or event_type == "DELETED" or run.deleting:
            # A run owned elsewhere is not started here; one being stopped is stopped either way. A
            # cancel request reaches the run's control here, also before its task registered the run.
            self.supervisor.observe(event_type, run)
            self.metrics.replica_owns(self.replica, self.supervisor.running)
        if event_type == "DELETED":
            self.rebalancer.saw_deleted(uid)
            self.reaper.forget(uid)
            self._passed_on.discard(uid)
            if owned and self._deleted is not None and uid:
                self._deleted(uid)
            if owned and run.status.children is not None:
                self._pass_on(delete_children, run.namespace, uid)
            return
        if run.finished:
            await self._finished(run, owned)
            return
        if (
            run.spec.cancel
            and owned
            and uid not in self._passed_on
            and (run.status.children is not None or self.supervisor.control(uid) is not None)
        ):
            self._passed_on.add(uid)
            self._pass_on(cancel_children, run.namespace, uid)
        # spec.priority is mutable: a run waiting for a slot takes its new place in the queue.
        self.executor.update_priority(uid, run.priority)
        if run.spec.approvals:
            self.executor.update_approvals(uid, run.spec.approvals)

    async def _finished(self, run: RunObject, owned: bool) -> None:
        # Only what the reaper reads: thousands of finished runs' results need not stay in memory.
        kept = FinishedRun(
            run.namespace,
            run.name,
            self.reaper.ttl(run.ttl_seconds_after_finished),
            run.status.completion_time,
        )
        self.rebalancer.saw_finished(run.uid, kept)
        if not owned:
            return
        self.reaper.observe(run.namespace, run.name, run.uid, kept.ttl, kept.completion_time)
        # A spec change after (or racing) the end: observed, so kstatus reads the run as final.
        await mark_observed(self.kube, run.namespace, run.name, run.status, run.generation)

    def _pass_on(self, action: Callable[[Any, str, str], Any], namespace: str, uid: str) -> None:
        """A parent's cancel or deletion, passed on to its children in the background."""

        async def passing() -> None:
            try:
                await action(self.kube, namespace, uid)
            except Exception as exc:  # garbage collection, or the children's own limits, end them later
                logger.warning("could not pass %s on to the children of %s: %s", action.__name__, uid, exc)

        task = asyncio.get_running_loop().create_task(passing())
        self._passing.add(task)
        task.add_done_callback(self._passing.discard)

    async def close(self) -> None:
        """Operator shutdown: with replicas, the runs go on to their next checkpoint (for at most the
        handoff grace) so the replicas that take them over repeat nothing; alone, or fenced, they
        stop writing at once. Either way whoever runs them next resumes them from the transcript."""
        await self.rebalancer.close()
        handing_over = self._replicated and not self.ownership.fenced
        await self.supervisor.close(self.rebalancer.grace if handing_over else 0.0)
        await self.reaper.close()


def _waiting_for_quota(event_type: str | None, run: RunObject) -> Elsewhere | None:
    """The run as a place in its namespace's quota line, if its status says it waits there."""
    wait = run.status.quota_wait
    if event_type == "DELETED" or run.deleting or wait is None or run.status.phase != Phase.PENDING:
        return None
    return Elsewhere(run.namespace, run.name, run.uid, run.created, run.priority, wait.limit)
