"""Membership of a replica group through ``coordination.k8s.io`` Leases: views, handoff barrier, fencing.

Why one Lease per replica, not one elected leader: every replica runs a share of the runs, so each
needs to know who else is alive, not who leads. Liveness is judged as client-go's leader election
judges it: by the observer's OWN monotonic clock, from when it saw a Lease's resourceVersion change,
never from the renewTime another machine wrote (clocks differ). A replica that cannot renew stops its
runs (fences itself) ``renew + 1 s`` before the earliest moment anyone can consider its Lease expired.

The handoff barrier: under view V a replica stops the runs it no longer owns, then publishes
``applied-view: V`` in its Lease; a run that is new to a replica under V starts only once every live
member's Lease shows V, so its old owner has stopped before the new owner resumes it. A run that was
this replica's in every view it applied since the last barrier it saw pass keeps running meanwhile:
no one else can have started it (see :meth:`Membership.owns`).

A replica whose event loop is stuck (a blocking call that never returns, a deadlock) would go on
renewing from its membership thread (detached.py) while none of its runs moves. So the membership is
told how long ago that loop last ran (``loop_age``) and does not renew while that is longer than
``AGENTRUN_LOOP_STALL_SECONDS``: the fence watchdog then fences it on time and the others take its
runs once its Lease expires, as if it had been cut off.

Here: when to renew, list and fence, and the view each listing gives. What a Lease's fields carry is
leases.py; the value ownership is decided by, and the barrier's rule, standing.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from agentrun.controller.replicas import ring
from agentrun.controller.replicas.leases import APPLIED_VIEW, GROUP_LABEL, SeenLease, lease_body, seen_leases
from agentrun.controller.replicas.standing import Standing
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIAlreadyExistsError, APIConflictError, APIError, APINotFoundError
from agentrun.metrics.definitions import Metrics
from agentrun.settings import Settings

__all__ = ["APPLIED_VIEW", "GROUP_LABEL", "Membership", "Standing"]

logger = logging.getLogger(__name__)

#: The fence fires this long before ``duration - renew`` after the last renewal sent (scheduling slack).
FENCE_MARGIN_SECONDS = 1.0
#: After a failed renewal, the next try comes this soon (not a whole renew interval later).
RETRY_SECONDS = 1.0
#: While a barrier is pending the group's Leases are listed this often: handoffs take a second.
BARRIER_POLL_SECONDS = 0.5
#: Otherwise this often (at most every renew interval). A renewal is dated from when it is first
#: seen, so listing only every renew interval dated it up to that much late, and a dead member's runs
#: moved that much later. A listing of one group's Leases is small: a few a second cost nothing.
OBSERVE_SECONDS = 1.0
#: The group is listed again this soon after another member's Lease would expire, to see it gone.
EXPIRY_SLACK_SECONDS = 0.05


class Membership:
    """This replica's Lease and its view of the group; the :class:`~.ownership.Ownership` of a replica."""

    def __init__(
        self,
        kube: KubeClient,
        settings: Settings,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        loop_age: Callable[[], float] | None = None,
    ) -> None:
        """``loop_age()``: seconds since the operator's event loop last ran (None: not watched)."""
        if settings.lease_namespace is None:
            raise ValueError("replica membership needs AGENTRUN_LEASE_NAMESPACE")
        self.kube = kube
        self.metrics = metrics
        self.name = settings.replica_name
        self.group = settings.replica_group
        self.namespace = settings.lease_namespace
        self.lease_name = ring.lease_name(self.group, self.name)
        #: Published on the Lease for `kubectl agentrun operators`: which namespaces this replica serves.
        self.serves = ",".join(settings.namespaces) or "*"
        self.duration = float(settings.lease_duration_seconds)
        self.renew_seconds = settings.lease_renew_seconds
        self.stall_limit = settings.loop_stall_seconds
        self._loop_age = loop_age
        self._stalled = False
        self._term = 0
        self.members: tuple[str, ...] = ()
        self.view = ring.view_id(())
        self._clock = clock
        self._seen: dict[str, SeenLease] = {}
        self._lease: dict[str, Any] | None = None
        #: Monotonic time the last successful renewal was SENT (the earliest an observer can date it).
        self._renewed_at: float | None = None
        #: When this replica last became a member (its first renewal, or the first after a fence), and
        #: when the last successful listing of the group was sent: no barrier passes before it listed
        #: the group after joining, or it would take every run for its own while it knows no one else.
        self._joined_at: float | None = None
        self._listed_at: float | None = None
        self._fenced = False
        self._left = False
        #: The view the wiring applied (to be published) and the view our Lease shows.
        self._applying: str | None = None
        self._published: str | None = None
        #: The last view whose barrier we saw pass; the members of it and of each view applied since.
        self._passed: str | None = None
        self._history: list[tuple[str, ...]] = []
        self._subscribers: list[Callable[[], None]] = []
        self._next_renewal = 0.0
        self.standing = Standing(self.name)

    # Ownership ------------------------------------------------------------------------------------

    @property
    def fenced(self) -> bool:
        return self._fenced

    @property
    def joined(self) -> bool:
        """A member now: its Lease renewed in time and not left."""
        return self._renewed_at is not None and not self._fenced and not self._left

    @property
    def barrier_passed(self) -> bool:
        return self.joined and self._passed == self.view

    def subscribe(self, changed: Callable[[], None]) -> None:
        self._subscribers.append(changed)

    def owner(self, uid: str) -> str:
        """The owner of ``uid`` under the current view ("" before any member is known)."""
        return ring.owner(uid, self.members) or ""

    def owns(self, uid: str) -> bool:
        """See :meth:`Standing.owns`: decided on the standing published by the last change."""
        return self.standing.owns(uid)

    @property
    def tenure(self) -> int | None:
        """See :attr:`Standing.tenure`."""
        return self.standing.tenure

    # The loop -------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Join, then renew every renew interval and list the group's Leases every second (more often
        while a barrier is pending, and the moment another member's Lease would expire), until
        cancelled or :meth:`leave`; a watchdog fences on time meanwhile."""
        watchdog = asyncio.create_task(self._watch_fence(), name=f"fence watchdog of {self.lease_name}")
        try:
            while not self._left:
                await self.step()
                await asyncio.sleep(self.pause())
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog

    async def step(self) -> None:
        """One round of :meth:`run`: renew when due, then list the group's Leases."""
        try:
            if self._clock() >= self._next_renewal:
                sent = self._clock()
                if await self.renew():
                    # Counted from when it was sent, as its answer is: a slow answer must not push the
                    # next renewal later, or each slow round would eat into the fence deadline twice.
                    self._next_renewal = sent + self.renew_seconds
                else:
                    self._next_renewal = self._clock() + min(RETRY_SECONDS, self.renew_seconds)
            await self.observe()
        except Exception:
            # The loop must outlive any surprise: without renewals the watchdog fences us, but a
            # dead loop would also stop listing the others, so keep trying.
            logger.exception("replica %s: membership round failed", self.name)
            self._next_renewal = self._clock() + min(RETRY_SECONDS, self.renew_seconds)

    def pause(self) -> float:
        """Seconds until the next round: the next renewal, listing, or another member's expiry."""
        now = self._clock()
        poll = min(OBSERVE_SECONDS, self.renew_seconds) if self.barrier_passed else BARRIER_POLL_SECONDS
        wake = min(poll, self._next_renewal - now)
        for lease in self._live_others(now):
            wake = min(wake, lease.seen_at + lease.duration + EXPIRY_SLACK_SECONDS - now)
        return max(0.0, wake)

    async def _watch_fence(self) -> None:
        """Fences on time even while a renewal hangs (a cut-off API server may never answer)."""
        while True:
            deadline = self._fence_deadline()
            wait = 0.5 if deadline is None else max(0.05, deadline - self._clock())
            await asyncio.sleep(min(wait, self.renew_seconds))
            self.check_fence()

    def _fence_deadline(self) -> float | None:
        if self._renewed_at is None or self._fenced:
            return None
        return self._renewed_at + self.duration - self.renew_seconds - FENCE_MARGIN_SECONDS

    def check_fence(self) -> None:
        """Fences this replica if its last successful renewal is too old (by its own clock)."""
        deadline = self._fence_deadline()
        if deadline is not None and self._clock() > deadline:
            self._fence(f"no Lease renewal for {self._clock() - (self._renewed_at or 0.0):.1f}s")

    def _fence(self, why: str) -> None:
        logger.warning("replica %s fences itself and stops its runs: %s", self.name, why)
        self._fenced = True
        self._term += 1
        self._applying = None  # back, it is a new member: it applies its view again
        self._passed = None
        self._history = []
        self._recompute(force=True)

    # Lease I/O ------------------------------------------------------------------------------------

    async def renew(self) -> bool:
        """Writes our Lease (creating it on the first call); True if the API server took it."""
        if self._left or self._loop_stalled():
            return False
        sent, applying = self._clock(), self._applying
        try:
            lease = await asyncio.wait_for(self._write(applying), self._answer_wait(sent))
        except APINotFoundError:
            # Someone deleted our Lease: the others dropped us at once and may take our runs.
            self._lease = None
            self._fence("our Lease was deleted")
            return False
        except APIConflictError:
            # Changed meanwhile, or deleted (a real server answers a PUT naming a gone uid with 409).
            try:
                self._lease = await asyncio.wait_for(
                    self.kube.get_lease(self.namespace, self.lease_name), self.renew_seconds
                )
            except APINotFoundError:
                self._lease = None
                self._fence("our Lease was deleted")
            except (APIError, TimeoutError):
                self.check_fence()
            return False
        except (APIError, TimeoutError) as exc:
            logger.warning("replica %s could not renew its Lease: %s", self.name, exc or "timed out")
            self.check_fence()
            return False
        if self._left:
            return False
        self._lease = lease
        if self._renewed_at is None or self._fenced:
            self._joined_at = sent
        self._renewed_at = sent
        self._published = applying
        if self._fenced:
            logger.info("replica %s renewed its Lease again and rejoins its group", self.name)
            self._fenced = False
        self._recompute()
        return True

    def _answer_wait(self, sent: float) -> float:
        """How long a renewal sent at ``sent`` waits for its answer: until the fence would come anyway
        (at least a renew interval; a renew interval before the first renewal and after a fence).

        Why not always a renew interval: a renewal answered later still renews the Lease as of when it
        was sent (no observer can date it earlier), so it keeps the replica a member safely. Giving up
        on it after a renew interval counted a slow but timely answer as a failure: a replica whose API
        server answered in 1-2 s for a few seconds (a loaded test machine) fenced itself, stopped every
        run where it was, and each asked its in-flight model request again once the replica rejoined.
        """
        deadline = self._fence_deadline()
        if deadline is None:
            return self.renew_seconds
        return max(self.renew_seconds, deadline - sent)

    def _loop_stalled(self) -> bool:
        """True while the operator's event loop has not run for longer than the stall limit: its runs
        are stuck, so its Lease must lapse and the others take them (the watchdog fences on time)."""
        if self._loop_age is None:
            return False
        age = self._loop_age()
        if age <= self.stall_limit:
            if self._stalled:
                logger.info("replica %s: the operator's event loop runs again; renewing its Lease", self.name)
                self._stalled = False
            return False
        if not self._stalled:
            logger.warning(
                "replica %s: the operator's event loop has not run for %.1fs; not renewing its Lease "
                "so other replicas take its runs",
                self.name,
                age,
            )
            self._stalled = True
        self.check_fence()
        return True

    async def _write(self, applying: str | None) -> dict[str, Any]:
        if self._lease is not None:
            return await self.kube.replace_lease(
                self.namespace, self.lease_name, self._body(self._lease, applying)
            )
        try:
            return await self.kube.create_lease(self.namespace, self._body(None, applying))
        except APIAlreadyExistsError:
            # Left by an earlier process of this name (a restarted pod): it is ours to take over.
            existing = await self.kube.get_lease(self.namespace, self.lease_name)
            return await self.kube.replace_lease(
                self.namespace, self.lease_name, self._body(existing, applying)
            )

    def _body(self, current: dict[str, Any] | None, applying: str | None) -> dict[str, Any]:
        return lease_body(
            current,
            name=self.lease_name,
            namespace=self.namespace,
            group=self.group,
            holder=self.name,
            serves=self.serves,
            duration=self.duration,
            applying=applying,
        )

    async def observe(self) -> None:
        """Lists the group's Leases and recomputes the view; a failed list changes nothing."""
        sent = self._clock()
        try:
            items = await asyncio.wait_for(
                self.kube.list_leases(self.namespace, label_selector=f"{GROUP_LABEL}={self.group}"),
                self.renew_seconds,
            )
        except (APIError, TimeoutError) as exc:
            logger.warning("replica %s could not list its group's Leases: %s", self.name, exc or "timed out")
            self.check_fence()
            return
        seen = seen_leases(items, self._seen, now=self._clock(), default_duration=self.duration)
        self._seen = seen  # a deleted Lease is gone at once
        self._listed_at = sent
        self.check_fence()
        self._recompute()

    def _listed_since_joining(self) -> bool:
        """Whether the group was listed after this replica (re)joined: before that, the Leases it knows
        may leave out members that were there all along (a new replica knows none), and a barrier it
        passed among those it knows would let it start runs the others are executing."""
        return (
            self._listed_at is not None and self._joined_at is not None and self._listed_at >= self._joined_at
        )

    def _live_others(self, now: float) -> list[SeenLease]:
        return [
            lease
            for name, lease in self._seen.items()
            if name != self.lease_name and lease.holder != self.name and now - lease.seen_at <= lease.duration
        ]

    async def applied(self, view: str) -> None:
        """The wiring stopped every run it does not own under ``view``: publish it (a stale view: ignored)."""
        if view != self.view or not self.joined:
            return
        if self._applying != view:
            self._applying = view
            # Only a history that starts at a passed barrier proves anything (a new member has none).
            if self._history and self._history[-1] != self.members:
                self._history.append(self.members)
        if self._published != view:
            sent = self._clock()
            await self.renew()
            self._next_renewal = sent + self.renew_seconds
        self._recompute()

    async def leave(self) -> None:
        """Deletes our Lease (call it after our runs stopped): the others drop us at once."""
        self._left = True
        self._recompute(force=True)
        if self._lease is None:
            return
        uid = (self._lease.get("metadata") or {}).get("uid")
        try:
            await self.kube.delete_lease(self.namespace, self.lease_name, uid=uid)
        except APINotFoundError:
            pass
        except APIError as exc:
            logger.warning("replica %s could not delete its Lease (it expires instead): %s", self.name, exc)
        self._lease = None

    # Views ----------------------------------------------------------------------------------------

    def _recompute(self, *, force: bool = False) -> None:
        now = self._clock()
        others = self._live_others(now)
        names = {lease.holder for lease in others}
        if self.joined:
            names.add(self.name)
        members = tuple(sorted(names))
        changed = force or members != self.members
        if members != self.members:
            # Back to a view we passed before is still a new view: someone may have run our runs between.
            self._passed = None
        self.members, self.view = members, ring.view_id(members)
        if (
            self.joined
            and self._listed_since_joining()
            and self._passed != self.view
            and self._published == self.view
            and all(lease.applied_view == self.view for lease in others)
        ):
            logger.info("replica %s: every member applied view %s %s", self.name, self.view, list(members))
            self._passed = self.view
            self._history = [members]
            changed = True
        self.standing = Standing(
            name=self.name,
            members=members,
            view=self.view,
            joined=self.joined,
            fenced=self._fenced,
            passed=self._passed,
            history=tuple(self._history),
            term=self._term,
        )
        self.metrics.replica_seen(self.name, len(members), fenced=self._fenced)
        if changed:
            for subscriber in list(self._subscribers):
                try:
                    subscriber()
                except Exception:
                    logger.exception("replica %s: a membership subscriber failed", self.name)
