"""What one watch event of an AgentRun sets in motion; Kopf's handler only passes the event here.

An unfinished run gets its execution started (supervising.py) or, when deleted, stopped; a cancel
request or a new spec.approvals reaches the executing run within that one event, no polling; a
finished run gets its TTL deletion scheduled and a later spec change marked observed.

With several replicas (controller/replicas/) only the owner of a run does any of that: the handler keeps
the newest body of every unfinished run it sees, whoever owns it, so that when ownership moves here it
can start the run at once, without waiting for a watch event that may never come; and when ownership
moves away it lets the run go on to its next checkpoint (AGENTRUN_HANDOFF_GRACE_SECONDS at most; a
fenced replica stops at once), waits for its task to end and only then tells the membership the new
view is applied (the handoff barrier). Each execution also checks, before every model request, tool
call and write, that this replica's membership has not lapsed since it started (``Held``): a fence
reaches this event loop as a callback, and a step of the run may be ahead of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic

from agentrun.controller.agentruns.children import cancel_children, delete_children
from agentrun.controller.agentruns.phases import describe_validation_error
from agentrun.controller.agentruns.reconciler import AgentRunReconciler
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.controller.agentruns.status_writing import mark_observed
from agentrun.controller.agentruns.supervising import RunSupervisor
from agentrun.controller.agentruns.ttl_reaping import TTLReaper
from agentrun.controller.replicas.ownership import Held, Ownership, Standalone
from agentrun.kube.objects import ObjectMeta

run_logger = logging.getLogger("agentrun.run")
logger = logging.getLogger(__name__)


class Handoff(Protocol):
    """The membership's side of the barrier (controller/replicas/membership.py)."""

    @property
    def view(self) -> str: ...

    async def applied(self, view: str) -> None: ...


@dataclass(frozen=True)
class _Finished:
    """What the TTL reaper needs of a finished run, kept so a new owner can take its deletion over."""

    namespace: str
    name: str
    ttl: int | None
    completion_time: str | None


class AgentRunHandler:
    def __init__(
        self,
        reconciler: AgentRunReconciler,
        ownership: Ownership | None = None,
        handoff: Handoff | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.reaper = TTLReaper(reconciler.kube, reconciler.settings.default_ttl_seconds_after_finished)
        self.supervisor = RunSupervisor(self._execute)
        self.ownership: Ownership = ownership if ownership is not None else Standalone()
        self.handoff = handoff
        self.metrics = reconciler.metrics
        self.replica = reconciler.settings.replica_name
        self.grace = reconciler.settings.handoff_grace_seconds
        # The newest body of every unfinished run seen (by uid), owned here or not.
        self.unfinished: dict[str, RunObject] = {}
        # Finished runs with a TTL (by uid): whoever owns one deletes it when its time is up.
        self.finished: dict[str, _Finished] = {}
        self._rebalance_wanted = False
        self._rebalancing: asyncio.Task[None] | None = None
        # Parents whose cancel or deletion was passed on to their children (by uid), and the tasks doing it.
        self._passed_on: set[str] = set()
        self._passing: set[asyncio.Task[None]] = set()
        # What each execution checks before its steps (by uid); only with replicas.
        self._holds: dict[str, Held] = {}
        self._closed = False
        self.ownership.subscribe(self._ownership_changed)

    async def _execute(self, run: RunObject, stopping: Callable[[], bool], yielding: asyncio.Event) -> None:
        if self.handoff is None:  # alone: every run is this replica's for good
            await self.reconciler.reconcile(run, stopping=stopping, log=run_logger, yielding=yielding)
            return
        held = self._holds[run.uid] = Held(self.ownership, run.uid, lambda: self.supervisor.stop(run.uid))
        try:
            await self.reconciler.reconcile(
                run, stopping=stopping, log=run_logger, yielding=yielding, held=held
            )
        finally:
            if self._holds.get(run.uid) is held:
                del self._holds[run.uid]

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event (None: from the initial listing): the run parsed, then acted on."""
        try:
            run = RunObject.parse(body)
        except pydantic.ValidationError as exc:  # the CRD's schema admits no such status
            meta = ObjectMeta.of(body)
            logger.error(
                "AgentRun %s/%s: its status does not match the CRD's schema, the run is left alone: %s",
                meta.namespace,
                meta.name,
                describe_validation_error(exc, "status"),
            )
            return
        self.reconciler.child_watch.observe(event_type, run)
        await self._observe(event_type, run)

    async def _observe(self, event_type: str | None, run: RunObject) -> None:
        uid = run.uid
        if event_type == "DELETED" or run.finished:
            self.unfinished.pop(uid, None)
        elif uid:
            self.unfinished[uid] = run
        owned = self._owns(uid)
        if owned or event_type == "DELETED" or run.deleting:
            # A run owned elsewhere is not started here; one being stopped is stopped either way.
            self.supervisor.observe(event_type, run)
            self.metrics.replica_owns(self.replica, self.supervisor.running)
        if event_type == "DELETED":
            self.finished.pop(uid, None)
            self.reaper.forget(uid)
            self.reconciler.forget(uid)
            self._passed_on.discard(uid)
            if owned and run.status.children is not None:
                self._pass_on(delete_children, run.namespace, uid)
            return
        if run.finished:
            await self._finished(run, owned)
            return
        if run.spec.cancel:
            # Also before the run task registered the run: it finds the request when it starts.
            self.reconciler.request_cancel(uid)
            if (
                owned
                and uid not in self._passed_on
                and (run.status.children is not None or uid in self.reconciler.runs)
            ):
                self._passed_on.add(uid)
                self._pass_on(cancel_children, run.namespace, uid)
        # spec.priority is mutable: a run waiting for a slot takes its new place in the queue.
        self.reconciler.update_priority(uid, run.priority)
        if run.spec.approvals:
            self.reconciler.update_approvals(uid, run.spec.approvals)

    async def _finished(self, run: RunObject, owned: bool) -> None:
        # Only what the reaper reads: thousands of finished runs' results need not stay in memory.
        kept = _Finished(
            run.namespace,
            run.name,
            self.reaper.ttl(run.ttl_seconds_after_finished),
            run.status.completion_time,
        )
        if kept.ttl is not None:
            self.finished[run.uid] = kept
        else:
            self.finished.pop(run.uid, None)
        if not owned:
            return
        self.reaper.observe(run.namespace, run.name, run.uid, kept.ttl, kept.completion_time)
        # A spec change after (or racing) the end: observed, so kstatus reads the run as final.
        await mark_observed(self.reconciler.kube, run.namespace, run.name, run.status, run.generation)

    def _pass_on(self, action: Callable[[Any, str, str], Any], namespace: str, uid: str) -> None:
        """A parent's cancel or deletion, passed on to its children in the background."""

        async def passing() -> None:
            try:
                await action(self.reconciler.kube, namespace, uid)
            except Exception as exc:  # garbage collection, or the children's own limits, end them later
                logger.warning("could not pass %s on to the children of %s: %s", action.__name__, uid, exc)

        task = asyncio.get_running_loop().create_task(passing())
        self._passing.add(task)
        task.add_done_callback(self._passing.discard)

    def _owns(self, uid: str) -> bool:
        """A fenced replica owns nothing, whatever its last view says."""
        return not self.ownership.fenced and self.ownership.owns(uid)

    def _ownership_changed(self) -> None:
        """The membership's callback (any view, barrier or fence change): applied in one task, in order."""
        if self.ownership.fenced:
            # At once, not behind a handoff that may be letting runs reach their checkpoints.
            for uid in self.supervisor.executing():
                self.supervisor.stop(uid)
        else:
            # Fenced and back already (its event loop was stuck meanwhile): the others may have resumed
            # the runs it started before, so these stop at once too.
            lapsed = [held.uid for held in list(self._holds.values()) if not held()]
            if lapsed:
                logger.warning(
                    "this replica fenced itself and rejoined: stopping the %d run(s) it had", len(lapsed)
                )
        if self._closed:
            return
        self._rebalance_wanted = True
        if self._rebalancing is None or self._rebalancing.done():
            self._rebalancing = asyncio.get_running_loop().create_task(self._keep_rebalancing())

    async def _keep_rebalancing(self) -> None:
        while self._rebalance_wanted and not self._closed:
            self._rebalance_wanted = False
            try:
                await self.rebalance()
            except asyncio.CancelledError:
                raise
            except Exception:  # the next change (at the latest the next renewal) tries again
                logger.exception("applying a change of run ownership failed")

    async def rebalance(self) -> None:
        """Stop the runs owned elsewhere now, start the ones owned here now, then report the view applied.

        The view is read before the stops: a run is reported handed over only once its task has ended
        (RunSupervisor.halt). When the view changed meanwhile, this view's report would say nothing
        true about the runs started since, so it is left to the next round (already scheduled).
        """
        view = self.handoff.view if self.handoff is not None else None
        lost = sorted(uid for uid in self.supervisor.executing() if not self._owns(uid))
        if lost:
            if self.ownership.fenced:
                # Cut off from the API server, or its event loop was stuck: its Lease may expire soon.
                logger.warning("fenced: stopping all %d runs executing here", len(lost))
                await self.supervisor.halt(lost)
            else:
                logger.info("handing %d run(s) over to other replicas", len(lost))
                await self.supervisor.handoff(lost, self.grace, at_once=self._not_looping)
            self.metrics.replica_handoff(self.replica, "out", len(lost))
        executing = self.supervisor.executing()
        gained = [uid for uid in self.unfinished if uid not in executing and self._owns(uid)]
        for uid in gained:
            self.supervisor.observe(None, self.unfinished[uid])
        started = len(self.supervisor.executing() - executing)
        if started:
            logger.info("took over %d run(s) from other replicas", started)
            self.metrics.replica_handoff(self.replica, "in", started)
        for uid, kept in self.finished.items():
            if self._owns(uid):
                self.reaper.observe(kept.namespace, kept.name, uid, kept.ttl, kept.completion_time)
            else:
                self.reaper.forget(uid)
        self.metrics.replica_owns(self.replica, self.supervisor.running)
        if self.handoff is not None and view is not None and self.handoff.view == view:
            await self.handoff.applied(view)

    def _not_looping(self, uid: str) -> bool:
        return not self.reconciler.looping(uid)

    async def close(self) -> None:
        """Operator shutdown: with replicas, the runs go on to their next checkpoint (for at most the
        handoff grace) so the replicas that take them over repeat nothing; alone, or fenced, they
        stop writing at once. Either way whoever runs them next resumes them from the transcript."""
        self._closed = True
        if self._rebalancing is not None:
            self._rebalancing.cancel()
            await asyncio.gather(self._rebalancing, return_exceptions=True)
        handing_over = self.handoff is not None and not self.ownership.fenced
        await self.supervisor.close(self.grace if handing_over else 0.0, at_once=self._not_looping)
        await self.reaper.close()
