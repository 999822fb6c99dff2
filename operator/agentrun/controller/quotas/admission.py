"""Admission of runs by the quotas of their namespace, before the operator's run queue.

A run is admitted when every quota of its namespace has room (the ledger says, quotas/ledger.py);
until then it stays Pending with reason QuotaExceeded, status.quotaWait naming the quota and limit,
and a message naming the quota, the limit, when room is expected, and how many runs of the namespace
wait ahead of it. The waiting runs of a namespace go in one order over every replica (spec.priority,
highest first, then creationTimestamp, then name; lines.py): runs ask the ledgers from the front of
the line only, so a small run cannot overtake a big one forever. A run without a sandbox does not
wait behind runs held back by a sandbox limit alone: it does not compete for what they wait for.
They look again on every change of a quota (watch events, our own writes), when the ledger said room
comes, and when a run ahead of them leaves the line.

Why a look at the cached ledger before writing: a blocked run changes nothing, and most waits are
blocked, so only runs that seem to fit write. Admission writes each quota in name order; when a
later quota turns out full (another process won the race), the earlier admissions are released,
which leaves their window's run count one too high: usage is counted early, never late.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from agentrun.api.spec import ResolvedRunSpec
from agentrun.api.status import AgentRunStatus, QuotaLimits, QuotaWait
from agentrun.controller.quotas import limits
from agentrun.controller.quotas.lines import (
    ORDER,
    Announcements,
    Candidate,
    Elsewhere,
    HeldBack,
    Lineup,
    Queue,
    admit,
    admitted_uids,
)
from agentrun.controller.quotas.watching import QuotaListingFailed, QuotaView, recheck_after
from agentrun.controller.quotas.writing import QuotaGone, utc_now
from agentrun.metrics.definitions import Metrics
from agentrun.quotas.ledger import Admitted, Blocked, Ledger, QuotaDefinition
from agentrun.quotas.per_run import PerRunViolation

logger = logging.getLogger(__name__)

REASON = "QuotaExceeded"
#: After a failed listing of the namespace's quotas, a waiting run tries again this soon.
LISTING_RETRY_SECONDS = 5.0

__all__ = [
    "AdmissionGate",
    "AdmittedSpec",
    "Announce",
    "Announcements",
    "Candidate",
    "HeldBack",
    "QuotaRefusal",
]

#: Says why a run waits: the condition's reason and message, and status.quotaWait.
Announce = Callable[[str, str, QuotaWait], Awaitable[None]]


@dataclass(frozen=True)
class QuotaRefusal:
    """The run can never be admitted: its first request alone is more than a quota's whole limit."""

    quota: str
    limit: str
    message: str


@dataclass(frozen=True)
class AdmittedSpec:
    """The run may go on: ``spec`` is what the loop uses, with the limits the quotas set in it."""

    spec: ResolvedRunSpec
    limits: QuotaLimits | None = None  # what the quotas set (status.quotaLimits)
    record: bool = False  # ``limits`` are new: status.quotaLimits is to be written


Write = Callable[[str, str, Callable[[Ledger, dt.datetime], Any]], Awaitable[Any]]


class AdmissionGate:
    def __init__(
        self,
        view: QuotaView,
        write: Write,
        metrics: Metrics,
        *,
        clock: Callable[[], dt.datetime] = utc_now,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        announce_interval: float = 10.0,
    ) -> None:
        """``clock`` and ``sleep``: the time the gate reads and waits by (tests pass a fake pair: when
        new numbers are due and when to look again come from them alone)."""
        self._view = view
        self._write = write
        self._metrics = metrics
        self._clock = clock
        self._sleep = sleep
        self._announce_interval = announce_interval
        self._queues: dict[str, Queue] = {}
        self._verdicts: dict[str, tuple[Any, tuple[str, Blocked] | None]] = {}
        self._lineups: dict[str, tuple[Any, Lineup]] = {}

    async def definitions(self, namespace: str, *, fresh_after: int | None = None) -> list[QuotaDefinition]:
        """The quotas of ``namespace`` (listed on first use, or with ``fresh_after`` by a listing sent
        after that mark, QuotaView.mark; a failed listing is tried again)."""
        while True:
            try:
                if fresh_after is None:
                    objects = await self._view.quotas(namespace)
                else:
                    objects = await self._view.fresh_quotas(namespace, fresh_after)
                return [QuotaDefinition.from_object(obj) for obj in objects]
            except QuotaListingFailed as exc:
                logger.warning("%s; trying again in %.0fs", exc, LISTING_RETRY_SECONDS)
                await asyncio.sleep(LISTING_RETRY_SECONDS)

    async def admit_run(
        self,
        run: Candidate,
        spec: ResolvedRunSpec,
        status: AgentRunStatus,
        *,
        started: bool,
        cancel: asyncio.Event,
        announce: Announce,
        mark: int | None = None,
    ) -> AdmittedSpec | PerRunViolation | QuotaRefusal | None:
        """The admission phase: per-run maxima, then room in every quota; None when cancelled.

        A run that started before (``started``) or has its limits recorded passed the maxima then,
        and keeps the limits it got (status.quotaLimits) whatever the quotas say now. A new one is
        checked against a listing sent after ``mark`` (QuotaView.mark, taken when it came), if given.
        """
        kept = limits.recorded(status)
        # A new run: listed after it came (``mark``), so that a quota created just before it binds it.
        new = not started and kept is None
        definitions = await self.definitions(run.namespace, fresh_after=mark if new else None)
        if not definitions and kept is None:
            return AdmittedSpec(spec)
        if not started and kept is None:
            refused = limits.violation(definitions, spec)
            if refused is not None:
                self._metrics.quota_refused(run.namespace, refused.quota, refused.field, "spec")
                return refused
        admitted = await self.admit(run, cancel, announce)
        if isinstance(admitted, QuotaRefusal) or not admitted:
            return admitted or None
        if kept is not None or started:  # a run that started without quota limits keeps none
            imposed = kept
        else:
            imposed = limits.imposed(await self.definitions(run.namespace), spec)
        return AdmittedSpec(
            limits.applied(spec, imposed), imposed, record=kept is None and imposed is not None
        )

    async def admit(
        self,
        run: Candidate,
        cancel: asyncio.Event,
        announce: Announce,
    ) -> bool | QuotaRefusal:
        """True once every quota of the namespace admitted the run; False when cancelled while waiting;
        a refusal when it can never be admitted."""
        queue = self._queues.setdefault(run.namespace, Queue())
        queue.enter(run)
        said = Announcements(self._announce_interval)
        refused: set[str] = set()  # quotas that counted this run as refused: once per run and quota
        try:
            while not cancel.is_set():
                changed, moved = self._view.changed(), queue.moved
                objects = await self._quota_objects(run.namespace)
                if not objects or all(_admitted_in(obj, run.uid) for obj in objects):
                    return True  # no quota, or a resumed run admitted before: not counted again
                run = next((r for r in queue.waiting if r.uid == run.uid), run)  # priority changes
                looked = await self._look(run, queue, objects, refused)
                if not isinstance(looked, HeldBack):
                    return looked
                queue.held_by(run, looked.cause[1])
                room_at = await self._announce(looked, said, announce)
                await self._wait(changed, moved, cancel, room_at)
            return False
        finally:
            queue.leave(run)

    async def _quota_objects(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's quotas; as last known when a listing (for a CRD installed since) failed."""
        try:
            return await self._view.quotas(namespace)
        except QuotaListingFailed:
            return self._view.cached(namespace)

    async def _look(
        self, run: Candidate, queue: Queue, objects: list[dict[str, Any]], refused: set[str]
    ) -> Literal[True] | QuotaRefusal | HeldBack:
        """One look at the quotas for a run in ``queue``'s line: admitted everywhere (True), refused
        for good, or what holds it back this time."""
        lineup = self._lineup(run.namespace, queue, objects)
        ahead = lineup.ahead_of(run)
        blocked = self._first_blocked(run, objects)
        # Admitted somewhere already (a resumed run, a quota added since): it holds a place that runs
        # ahead of it may be waiting for, so it must not wait behind them.
        front = ahead == 0 or any(_admitted_in(obj, run.uid) for obj in objects)
        if blocked is None and (front or run.uid in lineup.front):
            blocked = await self._admit_everywhere(run, objects)
            if blocked is None:
                return True
        if blocked is None:
            return HeldBack(
                f"waiting for {_runs(ahead)} of namespace {run.namespace} ahead of it in quota order",
                ("", ORDER),
            )
        quota, verdict = blocked
        if verdict.final or quota not in refused:
            refused.add(quota)
            await self._count_refused(run.namespace, quota, verdict.limit)
        if verdict.final:
            return QuotaRefusal(quota, verdict.limit, verdict.message)
        message = verdict.message + (f"; {_runs(ahead)} of the namespace ahead of it" if ahead else "")
        return HeldBack(message, (quota, verdict.limit), verdict.room_at)

    def _lineup(self, namespace: str, queue: Queue, objects: list[dict[str, Any]]) -> Lineup:
        """The namespace's line and who in it may write (lines.py), worked out once per version of the
        quotas and of the line (and second), not once per waiting run."""
        now = self._clock()
        key = (
            # Not the objects' resourceVersions: a ledger kept in PostgreSQL changes without them.
            self._view.changes(namespace),
            tuple(obj["metadata"]["name"] for obj in objects),
            queue.version,
            int(now.timestamp()),
        )
        known = self._lineups.get(namespace)
        if known is None or known[0] != key:
            known = key, Lineup.of(queue, objects, now)
            self._lineups[namespace] = known
        return known[1]

    async def _count_refused(self, namespace: str, quota: str, limit: str) -> None:
        """A refused admission, in the metrics and in the quota's status.refused."""
        self._metrics.quota_refused(namespace, quota, limit, "admission")
        with contextlib.suppress(QuotaGone):
            await self._write(namespace, quota, _count_refused)

    async def _announce(
        self,
        held: HeldBack,
        said: Announcements,
        announce: Announce,
    ) -> dt.datetime | None:
        """Says why the run waits when ``said`` allows it now; returns when to look again."""
        now = self._clock()
        if said.due(held, now):
            await announce(REASON, held.message, QuotaWait(quota=held.cause[0], limit=held.cause[1]))
            said.record(held, now)
        elif held.message != said.message:
            # Newer numbers to show: look again once they may be written.
            return _earliest(held.room_at, now + dt.timedelta(seconds=said.interval))
        return held.room_at

    def _first_blocked(self, run: Candidate, objects: list[dict[str, Any]]) -> tuple[str, Blocked] | None:
        """What the cached ledgers say, without writing: the first quota (by name) that is full.

        The answer for a run not admitted anywhere is the same for every such run, so it is worked
        out once per version of the quotas (and second): a change wakes every waiting run.
        """
        now = self._clock()
        fresh = not any(_admitted_in(obj, run.uid) for obj in objects)
        key = (
            # Not the objects' resourceVersions: a ledger kept in PostgreSQL changes without them.
            self._view.changes(run.namespace),
            tuple(obj["metadata"]["name"] for obj in objects),
            int(now.timestamp()),
            run.need_tokens,
            run.need_cost_usd,
            run.sandbox,
        )
        if fresh:
            known = self._verdicts.get(run.namespace)
            if known is not None and known[0] == key:
                return known[1]
        found: tuple[str, Blocked] | None = None
        for obj in objects:
            verdict = admit(run, Ledger.load(QuotaDefinition.from_object(obj), obj.get("status"), now), now)
            if isinstance(verdict, Blocked):
                found = obj["metadata"]["name"], verdict
                break
        if fresh:
            self._verdicts[run.namespace] = (key, found)
        return found

    async def _admit_everywhere(
        self, run: Candidate, objects: list[dict[str, Any]]
    ) -> tuple[str, Blocked] | None:
        done: list[str] = []
        for obj in objects:
            name = obj["metadata"]["name"]
            try:
                verdict = await self._write(run.namespace, name, partial(admit, run))
            except QuotaGone:
                continue
            if isinstance(verdict, Blocked):
                for earlier in done:
                    await self.release_in(run.namespace, earlier, run.uid)
                return name, verdict
            assert isinstance(verdict, Admitted)
            done.append(name)
        return None

    def saw_elsewhere(self, namespace: str, uid: str, run: Elsewhere | None) -> None:
        """A run seen waiting for quota by its status (None: seen not waiting, finished or deleted)."""
        queue = self._queues.get(namespace)
        if queue is None and run is None:
            return
        self._queues.setdefault(namespace, Queue()).saw_elsewhere(run, uid)

    def reprioritise(self, namespace: str, uid: str, priority: int) -> None:
        """spec.priority changed: a run waiting for quota moves within its namespace's line."""
        queue = self._queues.get(namespace)
        if queue is not None:
            queue.reprioritise(uid, priority)

    async def release(self, namespace: str, uid: str) -> None:
        """The run finished: it no longer counts against concurrentRuns anywhere."""
        # Only an admission is released (reservations settle on their own), so reading the admitted
        # list is enough; loading a whole Ledger per quota here was the costlier way to ask that.
        for obj in self._view.cached(namespace):
            if _admitted_in(obj, uid):
                await self.release_in(namespace, obj["metadata"]["name"], uid)

    async def release_in(self, namespace: str, quota: str, uid: str) -> None:
        with contextlib.suppress(QuotaGone):
            await self._write(namespace, quota, lambda ledger, now: ledger.release(uid))

    async def _wait(
        self,
        changed: asyncio.Event,
        moved: asyncio.Event,
        cancel: asyncio.Event,
        room_at: dt.datetime | None,
    ) -> None:
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(e.wait()) for e in (changed, moved, cancel)]
        waits.append(asyncio.ensure_future(self._sleep(recheck_after(room_at, self._clock()))))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


def _earliest(when: dt.datetime | None, other: dt.datetime) -> dt.datetime:
    return other if when is None else min(when, other)


def _count_refused(ledger: Ledger, now: dt.datetime) -> None:
    ledger.count_refused_run()


def _runs(count: int) -> str:
    return f"{count} run" + ("" if count == 1 else "s")


def _admitted_in(obj: Mapping[str, Any], uid: str) -> bool:
    return uid in admitted_uids(obj)
