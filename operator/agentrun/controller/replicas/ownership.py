"""What the run handler asks before it executes, deletes or marks a run: is this run mine?

Why a Protocol: with one replica (no lease namespace) the answer is always yes and nothing changes, so
the handler is the same code with :class:`Standalone` or with the Lease-backed membership.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

__all__ = ["Held", "Ownership", "Standalone"]

logger = logging.getLogger(__name__)


class Ownership(Protocol):
    def owns(self, uid: str) -> bool:
        """Owned under the current view and, for a run new to this replica, the handoff barrier passed."""
        ...

    def subscribe(self, changed: Callable[[], None]) -> None:
        """``changed()`` is called after every change of view, barrier or fence."""
        ...

    @property
    def fenced(self) -> bool:
        """True while this replica must run nothing (it could not renew its Lease in time)."""
        ...

    @property
    def tenure(self) -> int | None:
        """The same value from a join to the next fence; None while not a member (see :class:`Held`)."""
        ...


class Standalone:
    """The only replica: owns every run, never changes, never fenced."""

    def owns(self, uid: str) -> bool:
        return True

    def subscribe(self, changed: Callable[[], None]) -> None:
        """Nothing ever changes, so ``changed`` is never called."""

    @property
    def fenced(self) -> bool:
        return False

    @property
    def tenure(self) -> int | None:
        return 0


class Held:
    """Whether this replica still holds a run it started: asked on the operator's loop before each
    model request, tool call and transcript or status write of the run, by a few attribute reads (of
    the membership's Standing, which its own thread replaces as one immutable value).

    Why tenure, not the current owner: a run this replica lost to a new view still goes on to its next
    checkpoint (the handoff), and no one else starts it before that, since the barrier waits for this
    replica. What can let another replica start it meanwhile is this replica's membership lapsing
    (fenced: its Lease expires), which the membership thread decides while this replica's event loop
    may still be about to run one more step of the run, ahead of hearing of the fence. Such a step
    finds the tenure changed (even if the replica has rejoined since) and does not happen: ``lost()``
    stops the run, as a fence does, and the next owner resumes it from its transcript.
    """

    __slots__ = ("_lost", "_ownership", "_tenure", "uid")

    def __init__(self, ownership: Ownership, uid: str, lost: Callable[[], None]) -> None:
        self._ownership = ownership
        self.uid = uid
        self._lost = lost
        owned = not ownership.fenced and ownership.owns(uid)
        self._tenure = ownership.tenure if owned else None

    def __call__(self) -> bool:
        tenure = self._tenure
        if tenure is not None and self._ownership.tenure == tenure:
            return True
        if tenure is not None:
            logger.debug(
                "run %s: this replica's membership lapsed since it started the run; stopping it", self.uid
            )
            self._tenure = None
        self._lost()
        return False
