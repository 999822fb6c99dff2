"""Starting and stopping one loop task per unfinished AgentRun, driven by watch events.

Why not a Kopf daemon: Kopf puts a finalizer on every object a daemon serves. That costs two writes
per run (adding and removing it) plus one more watch event to process before the run can start, and
while the operator is down a running AgentRun cannot be deleted at all. A run needs none of that:
deletion shows in the watch stream (DELETED, or a deletionTimestamp while other finalizers hold the
object), the task is stopped there, and whatever the run wrote is owned by the run, so the garbage
collector removes it with the run.

A task that ends by itself is remembered until the object is deleted: a watch event that still
shows the run unfinished (sent before our terminal status patch) must not start it again. A task
that fails with an unexpected error is started again after a backoff; it resumes from its
transcript like after an operator restart.

A run handed to another replica is not cut off mid-step when that can be helped (`handoff`): it is
asked to yield at its next checkpoint, so the next owner asks the model nothing this replica already
asked, and is cancelled only if that takes longer than a grace period. A yielded run has not ended:
it may be started here again when its ownership comes back.

Each run with a task here has one :class:`~run_control.RunControl`, kept across its attempts: every
stop of the run goes through it, and the execution hands it to everything that must ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from agentrun.controller.agentruns.run_control import RunControl, StopCause
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.loop.errors import HandedOff

logger = logging.getLogger(__name__)

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0


class Execute(Protocol):
    def __call__(self, run: RunObject, control: RunControl) -> Awaitable[None]:
        """Run it to its end; raise HandedOff when it stopped at a checkpoint (`control.checkpoint`)."""
        ...


@dataclass
class _Task:
    run: RunObject  # the newest seen: a restarted attempt starts from the current status
    control: RunControl = field(init=False)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.control = RunControl(on_stop=self.cancel_task)

    def cancel_task(self) -> None:
        if self.task is not None:
            self.task.cancel()


class RunSupervisor:
    def __init__(
        self,
        execute: Execute,
        *,
        first_retry_seconds: float = FIRST_RETRY_SECONDS,
        max_retry_seconds: float = MAX_RETRY_SECONDS,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._execute = execute
        self._sleep = sleep
        self._first_retry = first_retry_seconds
        self._max_retry = max_retry_seconds
        self._running: dict[str, _Task] = {}
        self._ended: set[str] = set()
        self._closed = False

    @property
    def running(self) -> int:
        return len(self._running)

    def executing(self) -> set[str]:
        """The uids of the runs with a task here (running, or waiting to be started again)."""
        return set(self._running)

    def control(self, uid: str) -> RunControl | None:
        entry = self._running.get(uid)
        return entry.control if entry is not None else None

    def observe(self, event_type: str | None, run: RunObject) -> None:
        """One watch event (None: from the initial listing) of one AgentRun."""
        uid = run.uid
        if not uid:
            return
        if event_type == "DELETED":
            self.stop(uid)
            self._ended.discard(uid)
            return
        if run.deleting:
            self.stop(uid)
            return
        if run.finished:
            return
        running = self._running.get(uid)
        if running is None:
            if self._closed or uid in self._ended:
                return
            running = self._running[uid] = _Task(run)
            running.task = asyncio.create_task(self._supervise(uid, running), name=f"agentrun:{uid}")
        running.run = run
        running.control.saw(run.generation)
        if run.spec.cancel:
            # Also for an attempt not started yet, or between two: the control outlives them.
            running.control.request_cancel()

    def stop(self, uid: str, cause: StopCause = StopCause.STOPPED) -> None:
        entry = self._running.get(uid)
        if entry is not None:
            entry.control.stop(cause)

    def lapsed(self) -> list[str]:
        """The runs this replica no longer holds (its membership lapsed since they started): asking
        stops them (RunControl.held)."""
        return [uid for uid, entry in list(self._running.items()) if not entry.control.held()]

    async def halt(self, uids: Collection[str], cause: StopCause = StopCause.FENCED) -> None:
        """Stop these runs and wait until their tasks have ended, so they write nothing more.

        A replica hands a run over only after this returns (controller/replicas/): the next owner resumes
        it from a transcript nobody else appends to. A halted run may be started again later.
        """
        await self.handoff(uids, 0.0, cause)

    async def handoff(
        self, uids: Collection[str], grace: float, cause: StopCause = StopCause.HANDED_OFF
    ) -> None:
        """Stop these runs at their next checkpoint, or where they are after `grace` seconds, and wait
        until their tasks have ended, so they write nothing more (then `halt`'s promise holds).

        A run with no step under way (not in its loop yet: waiting for a Secret, a quota or a slot) is
        stopped at once; it has nothing to finish.
        """
        yielding: list[tuple[str, asyncio.Task[None]]] = []
        tasks = []
        for uid in uids:
            entry = self._running.get(uid)
            if entry is None or entry.task is None:
                continue
            tasks.append(entry.task)
            if grace > 0 and entry.control.looping:
                entry.control.stop_at_checkpoint(cause)
                yielding.append((uid, entry.task))
            else:
                entry.control.stop(cause)
        if yielding:
            await self._wait_for_checkpoints(yielding, grace)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait_for_checkpoints(
        self, yielding: list[tuple[str, asyncio.Task[None]]], grace: float
    ) -> None:
        waiting = {task for _, task in yielding}
        timer = asyncio.ensure_future(self._sleep(grace))
        try:
            while waiting and not timer.done():
                done, _ = await asyncio.wait({*waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
                waiting -= done
        finally:
            timer.cancel()
        late = [uid for uid, task in yielding if not task.done()]
        if late:
            logger.warning(
                "%d run(s) did not reach a checkpoint within %gs: stopping them where they are",
                len(late),
                grace,
            )
        for uid in late:
            self.stop(uid)

    async def close(self, grace: float = 0.0) -> None:
        """Operator shutdown: runs stop writing (at their next checkpoint, given a grace, else at once);
        a restart, or another replica, resumes them from the transcript."""
        self._closed = True
        await self.handoff(list(self._running), grace, StopCause.SHUTTING_DOWN)

    async def _supervise(self, uid: str, entry: _Task) -> None:
        delay = self._first_retry
        control = entry.control
        try:
            while not control.stopped:
                try:
                    await self._execute(entry.run, control)
                except asyncio.CancelledError:
                    raise
                except HandedOff:
                    return  # not ended: it may come back here
                except Exception:
                    if control.stopped or control.checkpoint.is_set():
                        return
                    logger.exception(
                        "the run %s failed unexpectedly; starting it again from its transcript in %.0fs",
                        uid,
                        delay,
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(control.wait_stopped(), timeout=delay)
                    delay = min(delay * 2, self._max_retry)
                else:
                    self._ended.add(uid)
                    return
        finally:
            if self._running.get(uid) is entry:
                del self._running[uid]
