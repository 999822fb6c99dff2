"""One run's stop signals in one object: must it stop, how soon, and why.

Why one object: a run can be asked to stop for five reasons, and each asks something different of it.
A cancel (spec.cancel) is the run's own ending: the loop finishes it Cancelled and writes that. A
handoff to another replica, or a shutdown with replicas, lets the loop go on to its next checkpoint
and stop there without ending the run (HandedOff). A fence (this replica's membership lapsed) or a
stop (the run was deleted, the grace ran out, the operator stops alone) stops it where it is, and from
then on nothing of the run may be sent or written. Spread over an Event here, a flag there and a
callback elsewhere, every part had to know which of them to ask; here each part asks one question:

- the loop waits on :attr:`cancel` and :attr:`checkpoint` (its CancelSignals, so it stays pure);
- the transcript store and the status writer ask :meth:`silenced` before each write;
- the model client and the tools ask :meth:`held` before each request or call (holding.py);
- the supervisor stops the run's task through :meth:`stop` and reads :meth:`why` when it ends.

The object outlives one attempt of the run: the supervisor keeps it while the run has a task here, so
a cancel that arrived before an attempt (or between two) is found by the next one.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

__all__ = ["RunControl", "StopCause"]


class StopCause(enum.StrEnum):
    """Why a run stops, in the order :meth:`RunControl.why` reports them when several apply."""

    STOPPED = "Stopped"  # deleted, or cut off after the grace: stops where it is
    FENCED = "Fenced"  # this replica's membership lapsed: another may resume it any moment
    SHUTTING_DOWN = "ShuttingDown"  # the operator stops: next checkpoint (replicas) or at once (alone)
    HANDED_OFF = "HandedOff"  # another replica owns it now: next checkpoint, then stop
    CANCELLED = "Cancelled"  # spec.cancel: the loop ends the run, Cancelled


class RunControl:
    """The stop signals of one run executing on this replica (see the module docstring)."""

    __slots__ = (
        "_at_checkpoint",
        "_cause",
        "_held",
        "_on_stop",
        "_stopped",
        "cancel",
        "checkpoint",
        "generation",
        "looping",
    )

    def __init__(self, *, on_stop: Callable[[], None] = lambda: None) -> None:
        self.cancel = asyncio.Event()
        # The newest spec generation the run's events showed (a cancel is one): its end says it observed it.
        self.generation: int | None = None
        self.checkpoint = asyncio.Event()
        # In its loop: a checkpoint is ahead. Before it (waiting for a Secret, quota or a slot) the run
        # has nothing to finish, so a handoff stops it at once.
        self.looping = False
        self._on_stop = on_stop
        self._cause: StopCause | None = None
        self._at_checkpoint: StopCause | None = None
        self._stopped = asyncio.Event()
        self._held: Callable[[], bool] | None = None

    def saw(self, generation: int | None) -> None:
        if generation is not None and (self.generation is None or generation > self.generation):
            self.generation = generation

    def request_cancel(self) -> None:
        self.cancel.set()

    def stop_at_checkpoint(self, cause: StopCause) -> None:
        """Go on to the next checkpoint, then stop without ending the run (the next owner resumes)."""
        if self._at_checkpoint is None:
            self._at_checkpoint = cause
        self.checkpoint.set()

    def stop(self, cause: StopCause = StopCause.STOPPED) -> None:
        """Stop where it is: nothing more is sent or written, and the run's task is cancelled."""
        if self._cause is not None:
            return
        self._cause = cause
        self._stopped.set()
        self._on_stop()

    def hold(self, held: Callable[[], bool] | None) -> None:
        """With replicas, for one attempt: whether this replica still holds the run (ownership.Held),
        which calls :meth:`stop` (FENCED) itself when it says no."""
        self._held = held

    def held(self) -> bool:
        """Asked before each model request and tool call: False once stopped or no longer held here."""
        if self._cause is not None:
            return False
        return self._held is None or self._held()

    def silenced(self) -> bool:
        """Asked before each write of the run: True once nothing more of it may be written."""
        return not self.held()

    @property
    def stopped(self) -> bool:
        return self._cause is not None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def why(self) -> StopCause | None:
        """The reason it stops, or None while it goes on."""
        if self._cause is not None:
            return self._cause
        if self._held is not None and not self._held():
            return self._cause or StopCause.FENCED
        if self._at_checkpoint is not None:
            return self._at_checkpoint
        return StopCause.CANCELLED if self.cancel.is_set() else None
