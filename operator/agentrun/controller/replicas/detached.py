"""Replica membership on a thread of its own, so a busy event loop cannot delay its Lease renewals.

Why: the operator's event loop carries every run. At 1000 runs on one process of a 2-core host its
callbacks wait seconds for their turn, and a renewal sent from that loop came late enough that the
replica fenced itself: it stopped every run, and each resumed, repeating the model request it had in
flight (docs/benchmarks.md). Here the :class:`~.membership.Membership` lives on its own thread, with its
own event loop and its own Kubernetes client (built by kube/calling.py's ``connect``, from the same
configuration loading), so it renews, lists its group's Leases and fences on its own clock whatever the
operator's loop is doing; a replica cut off from the API server still fences on time, since the fence
watchdog runs on that thread too.

The operator's loop only reads the membership's :class:`~.standing.Standing` (one immutable value,
consistent across threads), hears of each change through ``call_soon_threadsafe``, and hands
:meth:`applied` and :meth:`leave` over to the membership's loop, waiting for their outcome.

The other side of that trade: a replica whose event loop is stuck for good (a blocking call that never
returns, a deadlock) would keep renewing while none of its runs moves. So the operator's loop beats
every second (a timer, no per-run work), and the membership renews only while the last beat is younger
than ``AGENTRUN_LOOP_STALL_SECONDS`` (membership.py); stuck longer, the replica lets its Lease lapse,
fences, and its runs go to the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from agentrun.controller.replicas import ring
from agentrun.controller.replicas.membership import Membership
from agentrun.controller.replicas.standing import Standing
from agentrun.kube import calling
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun.settings import Settings

__all__ = ["DetachedMembership"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How soon a client that could not be built (an unreadable kubeconfig) is built again.
CONNECT_RETRY_SECONDS = 1.0
#: How often the operator's event loop proves it runs (membership.py renews only while it does).
BEAT_SECONDS = 1.0


class DetachedMembership:
    """The :class:`~.ownership.Ownership` and handoff of a replica whose membership runs on its own thread."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        connect: Callable[[], Awaitable[KubeClient]] = calling.connect,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if settings.lease_namespace is None:
            raise ValueError("replica membership needs AGENTRUN_LEASE_NAMESPACE")
        self.name = settings.replica_name
        self._settings = settings
        self._metrics = metrics
        self._connect = connect
        self._clock = clock
        self._subscribers: list[Callable[[], None]] = []
        #: Built on the membership's thread once its client is connected; read from any thread.
        self._inner: Membership | None = None
        self._main: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None
        self._closed = False
        #: The clock's time of the operator loop's last beat (written there, read on the thread).
        self._beat_at: float | None = None
        self._beating: asyncio.TimerHandle | None = None

    # Ownership and handoff, for the operator's loop -----------------------------------------------

    @property
    def standing(self) -> Standing:
        inner = self._inner
        return inner.standing if inner is not None else Standing(self.name)

    def owns(self, uid: str) -> bool:
        return self.standing.owns(uid)

    @property
    def fenced(self) -> bool:
        return self.standing.fenced

    @property
    def view(self) -> str:
        return self.standing.view

    @property
    def members(self) -> tuple[str, ...]:
        return self.standing.members

    def owner(self, uid: str) -> str:
        return ring.owner(uid, self.standing.members) or ""

    @property
    def tenure(self) -> int | None:
        return self.standing.tenure

    def subscribe(self, changed: Callable[[], None]) -> None:
        """``changed()`` is called on the loop that called :meth:`run`, after every change."""
        self._subscribers.append(changed)

    async def run(self) -> None:
        """Starts the membership's thread, then renews there until cancelled (the thread stays for
        :meth:`leave`, which ends it)."""
        if self._thread is None:
            self._main = asyncio.get_running_loop()
            self._beat()
            self._thread = threading.Thread(
                target=self._serve, name=f"agentrun membership {self.name}", daemon=True
            )
            self._thread.start()
        await asyncio.wrap_future(self._started)
        inner = self._inner
        if inner is None or self._closed:
            return
        # Cancelling this wait cancels the renewal loop on the membership's thread.
        await self._on_thread(inner.run())

    async def applied(self, view: str) -> None:
        """Publishes ``view`` in our Lease (on the membership's thread); returns once it is written."""
        inner = self._inner
        if inner is None or self._closed:
            return
        await self._on_thread(inner.applied(view))

    async def leave(self) -> None:
        """Deletes our Lease, then ends the membership's thread and closes its client."""
        if self._thread is None or self._closed:
            return
        try:
            inner = self._inner
            if inner is not None:
                await self._on_thread(inner.leave())
        finally:
            self._closed = True
            if self._beating is not None:
                self._beating.cancel()
            loop, stop = self._loop, self._stop
            if loop is not None and stop is not None:
                loop.call_soon_threadsafe(stop.set)
            await asyncio.to_thread(self._thread.join)

    def _beat(self) -> None:
        """On the operator's loop, every second: the proof that it runs, and how late it ran."""
        now = self._clock()
        if self._beat_at is not None:
            self._metrics.replica_loop_lagged(self.name, max(0.0, now - self._beat_at - BEAT_SECONDS))
        self._beat_at = now
        if self._main is not None and not self._closed:
            self._beating = self._main.call_later(BEAT_SECONDS, self._beat)

    def _loop_age(self) -> float:
        """On the membership's thread: seconds since the operator's loop last beat."""
        beat = self._beat_at
        if beat is None:
            return 0.0
        age = self._clock() - beat
        if age > 2 * BEAT_SECONDS:  # not beating: while it lasts, the lag shows how long
            self._metrics.replica_loop_lagged(self.name, age - BEAT_SECONDS)
        return age

    async def _on_thread(self, work: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None or loop.is_closed():
            work.close()
            raise RuntimeError(f"the membership thread of replica {self.name} has ended")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))

    # The membership's thread ----------------------------------------------------------------------

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._live())
        except BaseException as exc:  # never silent: the replica would stop renewing and fence
            logger.exception("replica %s: the membership thread failed", self.name)
            if not self._started.done():
                self._started.set_exception(exc)
        finally:
            loop.close()

    async def _live(self) -> None:
        self._stop = stop = asyncio.Event()
        kube = await self._connected(stop)
        if kube is None:
            self._started.set_result(None)
            return
        try:
            inner = Membership(
                kube, self._settings, self._metrics, clock=self._clock, loop_age=self._loop_age
            )
            inner.subscribe(self._changed_on_thread)
            self._inner = inner
            self._started.set_result(None)
            await stop.wait()
        finally:
            await kube.close()

    async def _connected(self, stop: asyncio.Event) -> KubeClient | None:
        while not stop.is_set() and not self._closed:
            try:
                return await self._connect()
            except Exception as exc:
                logger.warning("replica %s: no Kubernetes client for its Lease yet: %s", self.name, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), CONNECT_RETRY_SECONDS)
        return None

    def _changed_on_thread(self) -> None:
        main = self._main
        if main is None:
            return
        # RuntimeError: the operator's loop has closed, nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            main.call_soon_threadsafe(self._changed)

    def _changed(self) -> None:
        for subscriber in list(self._subscribers):
            try:
                subscriber()
            except Exception:
                logger.exception("replica %s: a membership subscriber failed", self.name)
