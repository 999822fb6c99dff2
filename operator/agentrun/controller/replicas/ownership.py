"""What the run handler asks before it executes, deletes or marks a run: is this run mine?

Why a Protocol: with one replica (no lease namespace) the answer is always yes and nothing changes, so
the handler is the same code with :class:`Standalone` or with the Lease-backed membership.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["Ownership", "Standalone"]


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


class Standalone:
    """The only replica: owns every run, never changes, never fenced."""

    def owns(self, uid: str) -> bool:
        return True

    def subscribe(self, changed: Callable[[], None]) -> None:
        """Nothing ever changes, so ``changed`` is never called."""

    @property
    def fenced(self) -> bool:
        return False
