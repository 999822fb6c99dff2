"""Applying a change of run ownership on this replica: the handoff between replicas, this side of it.

When the membership (membership.py) changes its view, its barrier or its fence, this replica stops the
runs it no longer owns and starts the ones it now owns, then tells the membership the view is applied.
Why in that order: the membership lets another replica start a run only once every replica applied a
view in which that replica owns it, so a run reported handed over must have stopped writing here.

Why the run bodies are kept here: the watch event that showed a run may have been long ago, and none
may come again; when ownership moves here the run starts at once from the newest body seen. Finished
runs with a TTL are kept too (a few fields each): whoever owns one deletes it when its time is up.

The collaborators are passed in: the runs' supervisor (agentruns/supervising.py), the TTL reaper, the
metrics. Nothing here knows how a run executes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from agentrun.controller.agentruns.run_control import StopCause
from agentrun.controller.replicas.ownership import Ownership
from agentrun.metrics.definitions import Metrics

__all__ = ["FinishedRun", "Handoff", "Rebalancer"]

logger = logging.getLogger(__name__)

Run = TypeVar("Run")
RunIn = TypeVar("RunIn", contravariant=True)


class Handoff(Protocol):
    """The membership's side of the barrier (membership.py)."""

    @property
    def view(self) -> str: ...

    async def applied(self, view: str) -> None: ...


class Runs(Protocol[RunIn]):
    """The supervisor of the runs executing here (agentruns/supervising.py)."""

    def executing(self) -> set[str]: ...

    def observe(self, event_type: str | None, run: RunIn) -> None: ...

    def stop(self, uid: str, cause: StopCause = ...) -> None: ...

    def lapsed(self) -> list[str]: ...

    async def halt(self, uids: Collection[str], cause: StopCause = ...) -> None: ...

    async def handoff(self, uids: Collection[str], grace: float, cause: StopCause = ...) -> None: ...


class Reaping(Protocol):
    """The TTL reaper (agentruns/ttl_reaping.py)."""

    def observe(
        self, namespace: str, name: str, uid: str, ttl: int | None, completion_time: str | None
    ) -> None: ...

    def forget(self, uid: str) -> None: ...


@dataclass(frozen=True)
class FinishedRun:
    """What the TTL reaper needs of a finished run, kept so a new owner can take its deletion over."""

    namespace: str
    name: str
    ttl: int | None
    completion_time: str | None


class Rebalancer(Generic[Run]):
    def __init__(
        self,
        ownership: Ownership,
        handoff: Handoff | None,
        runs: Runs[Run],
        reaper: Reaping,
        metrics: Metrics,
        *,
        replica: str,
        grace: float,
    ) -> None:
        self.ownership = ownership
        self.handoff = handoff
        self.runs = runs
        self.reaper = reaper
        self.metrics = metrics
        self.replica = replica
        self.grace = grace
        # The newest body of every unfinished run seen (by uid), owned here or not.
        self.unfinished: dict[str, Run] = {}
        # Finished runs with a TTL (by uid).
        self.finished: dict[str, FinishedRun] = {}
        self._wanted = False
        self._rebalancing: asyncio.Task[None] | None = None
        self._closed = False
        ownership.subscribe(self._changed)

    def owns(self, uid: str) -> bool:
        """A fenced replica owns nothing, whatever its last view says."""
        return not self.ownership.fenced and self.ownership.owns(uid)

    def saw_unfinished(self, uid: str, run: Run) -> None:
        self.unfinished[uid] = run

    def saw_finished(self, uid: str, kept: FinishedRun) -> None:
        self.unfinished.pop(uid, None)
        if kept.ttl is not None:
            self.finished[uid] = kept
        else:
            self.finished.pop(uid, None)

    def saw_deleted(self, uid: str) -> None:
        self.unfinished.pop(uid, None)
        self.finished.pop(uid, None)

    def _changed(self) -> None:
        """The membership's callback (any view, barrier or fence change): applied in one task, in order."""
        if self.ownership.fenced:
            # At once, not behind a handoff that may be letting runs reach their checkpoints.
            for uid in self.runs.executing():
                self.runs.stop(uid, StopCause.FENCED)
        else:
            # Fenced and back already (its event loop was stuck meanwhile): the others may have resumed
            # the runs it started before, so these stop at once too (asking stops them).
            lapsed = self.runs.lapsed()
            if lapsed:
                logger.warning(
                    "this replica fenced itself and rejoined: stopping the %d run(s) it had", len(lapsed)
                )
        if self._closed:
            return
        self._wanted = True
        if self._rebalancing is None or self._rebalancing.done():
            self._rebalancing = asyncio.get_running_loop().create_task(self._keep_rebalancing())

    async def _keep_rebalancing(self) -> None:
        while self._wanted and not self._closed:
            self._wanted = False
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
        await self._hand_over()
        self._take_over()
        for uid, kept in self.finished.items():
            if self.owns(uid):
                self.reaper.observe(kept.namespace, kept.name, uid, kept.ttl, kept.completion_time)
            else:
                self.reaper.forget(uid)
        self.metrics.replica_owns(self.replica, len(self.runs.executing()))
        if self.handoff is not None and view is not None and self.handoff.view == view:
            await self.handoff.applied(view)

    async def _hand_over(self) -> None:
        lost = sorted(uid for uid in self.runs.executing() if not self.owns(uid))
        if not lost:
            return
        if self.ownership.fenced:
            # Cut off from the API server, or its event loop was stuck: its Lease may expire soon.
            logger.warning("fenced: stopping all %d runs executing here", len(lost))
            await self.runs.halt(lost, StopCause.FENCED)
        else:
            logger.info("handing %d run(s) over to other replicas", len(lost))
            await self.runs.handoff(lost, self.grace, StopCause.HANDED_OFF)
        self.metrics.replica_handoff(self.replica, "out", len(lost))

    def _take_over(self) -> None:
        executing = self.runs.executing()
        for uid, run in list(self.unfinished.items()):
            if uid not in executing and self.owns(uid):
                self.runs.observe(None, run)
        started = len(self.runs.executing() - executing)
        if started:
            logger.info("took over %d run(s) from other replicas", started)
            self.metrics.replica_handoff(self.replica, "in", started)

    async def close(self) -> None:
        self._closed = True
        if self._rebalancing is not None:
            self._rebalancing.cancel()
            await asyncio.gather(self._rebalancing, return_exceptions=True)
