"""The schedules this replica serves: one asyncio task per AgentSchedule it owns.

Kopf's event handler on agentschedules passes every body here; a handler on the schedules' runs wakes the
task of their schedule, so a run that ends frees a Forbid schedule, updates status.active and prunes the
history at once. Each task sleeps until its schedule's next time (or RESYNC_SECONDS, whichever is first).

With several replicas (controller/replicas/) only the owner of a schedule's uid serves it. A handoff needs
no barrier: a run's name is derived from its scheduled time, so two replicas serving one schedule for a
moment create the run once (the other gets 409 AlreadyExists).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.api import SCHEDULE_KIND
from agentrun.controller.replicas.ownership import Ownership, Standalone
from agentrun.controller.schedules.serving import ScheduleServer
from agentrun.kube.calling import KubeClient
from agentrun.kube.objects import ObjectMeta
from agentrun.metrics.definitions import Metrics

logger = logging.getLogger(__name__)

#: A pass at least this often, to notice what no event announced (e.g. a run deleted while offline).
RESYNC_SECONDS = 60.0
#: After a failed pass (the API server unreachable, a conflict), the next one comes this much later.
RETRY_SECONDS = 5.0
#: After an event (a run's status write, our own status write), wait this long before the pass, so a
#: burst of events costs one listing of the schedule's runs, not one each.
SETTLE_SECONDS = 0.5
#: Wake a little after a due time rather than a little before: the clock of the loop and the wall clock
#: may disagree by a few milliseconds.
MARGIN_SECONDS = 0.05


class _Served:
    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body = body
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class ScheduleController:
    def __init__(
        self,
        kube: KubeClient,
        metrics: Metrics,
        ownership: Ownership | None = None,
        *,
        instance: str,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        resync_seconds: float = RESYNC_SECONDS,
    ) -> None:
        """``instance``: this replica's name (Settings.replica_name), which its Events report."""
        self.server = ScheduleServer(kube, metrics, instance=instance, clock=clock)
        self.metrics = metrics
        self.ownership: Ownership = ownership if ownership is not None else Standalone()
        self.clock = clock
        self.resync_seconds = resync_seconds
        self.schedules: dict[str, _Served] = {}
        self._closed = False
        self.ownership.subscribe(self._rebalance)

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of an AgentSchedule (None: from the initial listing)."""
        meta = ObjectMeta.of(body)
        uid = meta.uid
        if not uid:
            return
        if event_type == "DELETED" or meta.deletion_timestamp is not None:
            self._stop(uid)
            self.schedules.pop(uid, None)
            self.server.forget(uid)
            self.metrics.schedule_next(meta.namespace, meta.name, None)
            return
        served = self.schedules.get(uid)
        if served is None:
            served = self.schedules[uid] = _Served(body)
        served.body = body
        served.wake.set()
        self._start_if_owned(uid)

    def run_changed(self, body: Mapping[str, Any]) -> None:
        """A watch event of a run a schedule created: its schedule looks again."""
        for ref in ObjectMeta.of(body).owner_references:
            if ref.kind == SCHEDULE_KIND and ref.uid in self.schedules:
                self.schedules[ref.uid].wake.set()

    def _owns(self, uid: str) -> bool:
        return not self.ownership.fenced and self.ownership.owns(uid)

    def _start_if_owned(self, uid: str) -> None:
        served = self.schedules[uid]
        if self._closed or not self._owns(uid):
            self._stop(uid)
            return
        if served.task is None or served.task.done():
            served.task = asyncio.get_running_loop().create_task(self._serve(uid))

    def _stop(self, uid: str) -> None:
        served = self.schedules.get(uid)
        if served is not None and served.task is not None:
            served.task.cancel()
            served.task = None

    def _rebalance(self) -> None:
        for uid in list(self.schedules):
            self._start_if_owned(uid)

    async def _serve(self, uid: str) -> None:
        while True:
            served = self.schedules.get(uid)
            if served is None:
                return
            served.wake.clear()
            metadata = served.body.get("metadata") or {}
            try:
                next_time = await self.server.serve(served.body)
                wait = self.resync_seconds
                if next_time is not None:
                    wait = min(wait, max((next_time - self.clock()).total_seconds(), 0.0) + MARGIN_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning(
                    "AgentSchedule %s/%s: pass failed, trying again in %.0f s: %s",
                    metadata.get("namespace"),
                    metadata.get("name"),
                    RETRY_SECONDS,
                    exc,
                )
                wait = RETRY_SECONDS
            try:
                await asyncio.wait_for(served.wake.wait(), wait)
            except TimeoutError:
                continue  # a due time (or the periodic look): at once
            await asyncio.sleep(SETTLE_SECONDS)

    async def close(self) -> None:
        self._closed = True
        tasks = [s.task for s in self.schedules.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
