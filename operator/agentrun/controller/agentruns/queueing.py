"""The operator's run slots (AGENTRUN_MAX_CONCURRENT_RUNS), shared fairly between namespaces.

Why not a semaphore: it serves waiters first come, first served, so one namespace that creates 500
runs holds every slot until the last of them has run, and a run created a minute later in another
namespace waits behind all 500. Here the namespaces with waiting runs take turns: a released slot
goes to the next namespace in the rotation, which then moves to the back of it. Within a namespace
the run with the highest ``spec.priority`` goes first, then the oldest (creationTimestamp), then
by name, so the order is the same in every operator process and after every restart.

Every waiting run knows its position (1 = the next slot is its): positions are found by playing
the rotation forward, and a run is told through its callback whenever its own position changes.
Recomputing is deferred to the next turn of the event loop, so a burst of arrivals (the initial
listing at start-up) or a release that moves every waiter costs one pass, not one per change.

Pure asyncio: nothing here knows Kubernetes; the queue phase (phases.py) writes what it reports.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

PositionCallback = Callable[[int], None]


@dataclass(frozen=True)
class QueuedRun:
    """The run as the queue orders it."""

    namespace: str
    name: str
    uid: str
    created: str = ""  # metadata.creationTimestamp: RFC 3339 in UTC, so it sorts as text
    priority: int = 0  # spec.priority when the run entered; Ticket.priority follows later changes


class _State(enum.Enum):
    WAITING = "waiting"
    HOLDING = "holding"
    LEFT = "left"


class Ticket:
    """One run's place in the queue: waiting, then holding a slot, until it leaves."""

    def __init__(self, run: QueuedRun, on_position: PositionCallback | None) -> None:
        self.run = run
        self.priority = run.priority
        #: 1 = next; None while holding a slot, after leaving, or before the first count.
        self.position: int | None = None
        #: Set once the ticket holds a slot.
        self.granted = asyncio.Event()
        #: Set when the slot is granted, and when the position changes while ``listening``; a waiter
        #: clears it before looking. A waiter that will look again at a time of its own anyway (its
        #: next status write is rate-limited) stops listening, so a release that moves every position
        #: does not wake every waiter.
        self.changed = asyncio.Event()
        self.listening = True
        self._on_position = on_position
        self._state = _State.WAITING

    @property
    def waiting(self) -> bool:
        return self._state is _State.WAITING

    @property
    def holding(self) -> bool:
        return self._state is _State.HOLDING

    def order(self) -> tuple[int, str, str, str]:
        """Within a namespace: higher priority first, then older, then by name (uid: never equal)."""
        return (-self.priority, self.run.created, self.run.name, self.run.uid)

    def _moved(self, position: int) -> None:
        self.position = position
        if self.listening:
            self.changed.set()
        if self._on_position is None:
            return
        try:
            self._on_position(position)
        except Exception:  # one waiter's callback must not keep the others from hearing theirs
            logger.exception("the queue position callback of %s/%s failed", self.run.namespace, self.run.name)

    def __repr__(self) -> str:
        return f"<Ticket {self.run.namespace}/{self.run.name} {self._state.value} position={self.position}>"


class FairQueue:
    """``capacity`` run slots; waiting runs get them in turn across namespaces."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a queue needs at least one slot, not {capacity}")
        self.capacity = capacity
        self._holding = 0
        self._waiting: dict[str, dict[str, Ticket]] = {}  # namespace -> uid -> ticket
        self._rotation: deque[str] = deque()  # namespaces with waiting runs, in the order they get slots
        self._counting = False  # a recount of the positions is scheduled

    @property
    def busy(self) -> int:
        """Slots held now."""
        return self._holding

    @property
    def waiting(self) -> int:
        return sum(len(tickets) for tickets in self._waiting.values())

    def waiting_in(self, namespace: str) -> int:
        return len(self._waiting.get(namespace, ()))

    def enter(self, run: QueuedRun, on_position: PositionCallback | None = None) -> Ticket:
        """A ticket that holds a slot at once if one is free and nobody waits, else waits in turn.

        The caller must :meth:`leave` it in every case (cancelled while waiting, or done running).
        """
        ticket = Ticket(run, on_position)
        if self._holding < self.capacity and not self._rotation:
            self._grant(ticket)
            return ticket
        tickets = self._waiting.setdefault(run.namespace, {})
        if run.uid in tickets:
            raise ValueError(f"{run.namespace}/{run.name} ({run.uid}) is already waiting")
        if not tickets:
            self._rotation.append(run.namespace)
        tickets[run.uid] = ticket
        self._recount_soon()
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """Done with the ticket: a waiting run gives up its place, a running one its slot.

        Idempotent, so a ``finally`` may call it whatever happened before.
        """
        if ticket.waiting:
            self._remove(ticket)
            ticket._state = _State.LEFT
            ticket.position = None
            self._recount_soon()
        elif ticket.holding:
            ticket._state = _State.LEFT
            self._holding -= 1
            self._hand_over()

    def reprioritise(self, uid: str, priority: int) -> None:
        """spec.priority of a run changed; a waiting run moves within its namespace accordingly."""
        for tickets in self._waiting.values():
            ticket = tickets.get(uid)
            if ticket is not None:
                if ticket.priority != priority:
                    ticket.priority = priority
                    self._recount_soon()
                return

    def positions(self) -> dict[str, int]:
        """Every waiting run's position (by uid), playing the rotation forward.

        Round ``k`` of the rotation gives a slot to the ``k``-th run of every namespace that still
        has one, namespaces in rotation order; that is what successive releases will do, as long as
        no run arrives, leaves or changes priority meanwhile.
        """
        return {ticket.run.uid: position for position, ticket in enumerate(self._in_turn(), start=1)}

    def _in_turn(self) -> Iterator[Ticket]:
        lines = [sorted(self._waiting[ns].values(), key=Ticket.order) for ns in self._rotation]
        depth = max((len(line) for line in lines), default=0)
        for k in range(depth):
            for line in lines:
                if k < len(line):
                    yield line[k]

    def _grant(self, ticket: Ticket) -> None:
        ticket._state = _State.HOLDING
        ticket.position = None
        self._holding += 1
        ticket.granted.set()
        ticket.changed.set()

    def _remove(self, ticket: Ticket) -> None:
        namespace = ticket.run.namespace
        tickets = self._waiting[namespace]
        del tickets[ticket.run.uid]
        if not tickets:
            del self._waiting[namespace]
            self._rotation.remove(namespace)

    def _hand_over(self) -> None:
        """Free slots go to the next namespaces in turn, at once (no waiting run sees a free slot)."""
        moved = False
        while self._holding < self.capacity and self._rotation:
            namespace = self._rotation.popleft()
            tickets = self._waiting[namespace]
            ticket = min(tickets.values(), key=Ticket.order)
            del tickets[ticket.run.uid]
            if tickets:
                self._rotation.append(namespace)
            else:
                del self._waiting[namespace]
            self._grant(ticket)
            moved = True
        if moved:
            self._recount_soon()

    def _recount_soon(self) -> None:
        if not self._counting:
            self._counting = True
            asyncio.get_running_loop().call_soon(self._recount)

    def _recount(self) -> None:
        self._counting = False
        for position, ticket in enumerate(self._in_turn(), start=1):
            if ticket.position != position:
                ticket._moved(position)
