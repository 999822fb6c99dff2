"""What a replica's membership decides ownership by, as one immutable value (membership.py keeps it).

The handoff barrier's rule lives here: a run is this replica's under the current view once every
live member applied that view, or while it was this replica's in every view applied since the last
barrier that passed (:meth:`Standing.owns` says why that is safe).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrun.controller.replicas import ring

__all__ = ["Standing"]


@dataclass(frozen=True)
class Standing:
    """Everything :meth:`Membership.owns` decides by, as one immutable value.

    Why a value: the membership may run on a thread of its own (controller/replicas/detached.py) while
    the operator's event loop asks it about runs; one attribute read of a frozen value is consistent,
    where reading the view, the barrier and the history one field at a time could mix two states.
    """

    name: str
    members: tuple[str, ...] = ()
    view: str = ring.view_id(())
    joined: bool = False
    fenced: bool = False
    #: The last view whose barrier this replica saw pass; the members of it and of each view applied since.
    passed: str | None = None
    history: tuple[tuple[str, ...], ...] = ()
    #: How many times this replica fenced itself (or found its Lease deleted) so far.
    term: int = 0

    @property
    def barrier_passed(self) -> bool:
        return self.joined and self.passed == self.view

    @property
    def tenure(self) -> int | None:
        """The same value from a join to the next fence; None while not a member.

        Why: a run started under one tenure may have been taken over by another replica once it
        ended, even if this replica is a member again by the time the run takes its next step.
        """
        return self.term if self.joined else None

    def owns(self, uid: str) -> bool:
        """Mine under the current view, and either the barrier of this view passed or the run was mine
        in every view applied since the last barrier that passed.

        Why the second case is safe: another replica starts a run only under a view whose barrier
        passed, and that barrier needs this replica's applied-view, so that view is one of those
        applied here (where the run was ours), unless that replica considered us dead, which needs our
        Lease unrenewed for a whole duration, and by then we fenced ourselves and forgot the history.
        """
        if not self.joined or ring.owner(uid, self.members) != self.name:
            return False
        if self.passed == self.view:
            return True
        return bool(self.history) and all(ring.owner(uid, view) == self.name for view in self.history)
