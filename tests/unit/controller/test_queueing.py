"""The fair queue gives run slots to namespaces in turn, by priority and age within one, and tells
every waiting run where it stands."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable

import pytest

from agentrun.controller.agentruns.queueing import FairQueue, QueuedRun, Ticket

_serial = itertools.count()


def run(namespace: str, name: str, *, created: str = "2026-11-24T09:00:00Z", priority: int = 0) -> QueuedRun:
    return QueuedRun(namespace, name, f"uid-{namespace}-{name}-{next(_serial)}", created, priority)


def at(second: int) -> str:
    return f"2026-11-24T09:{second // 60:02d}:{second % 60:02d}Z"


class Positions:
    """What the callbacks told each run, in order."""

    def __init__(self) -> None:
        self.told: dict[str, list[int]] = {}

    def of(self, name: str) -> list[int]:
        return self.told.get(name, [])

    def callback(self, name: str) -> Callable[[int], None]:
        return lambda position: self.told.setdefault(name, []).append(position)


class Slots:
    """A queue and every ticket it gave, to see who got a released slot."""

    def __init__(self, capacity: int) -> None:
        self.queue = FairQueue(capacity)
        self.tickets: list[Ticket] = []
        self.holders: list[Ticket] = []

    def enter(self, queued: QueuedRun) -> Ticket:
        ticket = self.queue.enter(queued)
        self.tickets.append(ticket)
        if ticket.holding:
            self.holders.append(ticket)
        return ticket

    def release_one(self) -> Ticket:
        """The oldest holder leaves; returns the ticket that got its slot."""
        self.queue.leave(self.holders.pop(0))
        granted = [t for t in self.tickets if t.holding and t not in self.holders]
        assert len(granted) == 1, granted
        self.holders.append(granted[0])
        return granted[0]

    def release(self, count: int) -> list[str]:
        return [self.release_one().run.name for _ in range(count)]


async def settled() -> None:
    """Positions are recounted on the next turn of the event loop."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_a_free_slot_is_held_at_once_and_a_full_queue_makes_runs_wait() -> None:
    slots = Slots(2)
    first, second = slots.enter(run("a", "r1")), slots.enter(run("a", "r2"))
    third = slots.enter(run("a", "r3"))
    assert first.holding and second.holding and first.granted.is_set()
    assert third.waiting and not third.granted.is_set()
    assert (slots.queue.busy, slots.queue.waiting) == (2, 1)


async def test_a_released_slot_goes_to_the_next_waiter_at_once() -> None:
    queue = FairQueue(1)
    holder = queue.enter(run("a", "r1"))
    waiter = queue.enter(run("a", "r2"))
    queue.leave(holder)
    assert waiter.holding and waiter.granted.is_set(), "no turn of the event loop in between"
    assert (queue.busy, queue.waiting) == (1, 0)


async def test_one_namespaces_500_waiting_runs_cannot_starve_another_namespaces_one() -> None:
    slots = Slots(3)
    for i in range(3):
        slots.enter(run("busy", f"h{i}", created=at(0)))
    for i in range(500):
        slots.enter(run("busy", f"r{i:03d}", created=at(1)))
    lone = slots.enter(run("quiet", "lone", created=at(59)))
    await settled()
    assert lone.position == 2, "the busy namespace's turn is first, then the quiet one's"
    assert slots.release(2) == ["r000", "lone"]


async def test_a_lone_run_arriving_right_after_its_namespaces_turn_gets_the_next_slot_but_one() -> None:
    slots = Slots(1)
    slots.enter(run("a", "h"))
    for i in range(10):
        slots.enter(run("a", f"r{i}", created=at(i)))
    slots.enter(run("b", "b0", created=at(0)))
    # a's turn, then b's: b0 takes the second slot and b leaves the rotation.
    assert slots.release(2) == ["r0", "b0"]
    lone = slots.enter(run("b", "b1", created=at(30)))
    await settled()
    assert lone.position == 2
    assert slots.release(2) == ["r1", "b1"]


async def test_namespaces_take_turns_in_the_order_their_runs_started_waiting() -> None:
    slots = Slots(1)
    slots.enter(run("x", "holder"))
    for namespace, count in (("a", 3), ("b", 1), ("c", 2)):
        for i in range(count):
            slots.enter(run(namespace, f"{namespace}{i}", created=at(i)))
    assert slots.release(6) == ["a0", "b0", "c0", "a1", "c1", "a2"]


async def test_within_a_namespace_higher_priority_goes_first_then_older_then_by_name() -> None:
    slots = Slots(1)
    slots.enter(run("a", "holder"))
    slots.enter(run("a", "old-low", created=at(1), priority=-5))
    slots.enter(run("a", "young-high", created=at(9), priority=10))
    slots.enter(run("a", "zeta", created=at(5)))
    slots.enter(run("a", "alpha", created=at(5)))
    slots.enter(run("a", "oldest", created=at(2)))
    assert slots.release(5) == ["young-high", "oldest", "alpha", "zeta", "old-low"]


async def test_a_priority_changed_while_waiting_moves_the_run_and_its_position() -> None:
    slots = Slots(1)
    slots.enter(run("a", "holder"))
    tickets = [slots.enter(run("a", f"r{i}", created=at(i))) for i in range(5)]
    await settled()
    last = tickets[-1]
    assert last.position == 5
    slots.queue.reprioritise(last.run.uid, 100)
    await settled()
    assert last.position == 1
    assert [t.position for t in tickets[:-1]] == [2, 3, 4, 5]
    assert slots.release_one() is last
    slots.queue.reprioritise("not-waiting", 7)  # a run that does not wait (any more) is nobody's business


async def test_a_run_cancelled_while_waiting_gives_up_its_place_and_the_others_move_up() -> None:
    slots = Slots(1)
    slots.enter(run("a", "holder"))
    tickets = [slots.enter(run("a", f"r{i}", created=at(i))) for i in range(4)]
    await settled()
    slots.queue.leave(tickets[1])
    slots.queue.leave(tickets[1])  # idempotent
    await settled()
    assert not tickets[1].waiting and not tickets[1].holding and tickets[1].position is None
    assert [t.position for t in (tickets[0], tickets[2], tickets[3])] == [1, 2, 3]
    assert slots.queue.waiting == 3
    assert slots.release(3) == ["r0", "r2", "r3"]
    assert slots.queue.busy == 1


async def test_a_namespace_whose_only_waiter_was_cancelled_loses_its_turn() -> None:
    slots = Slots(1)
    slots.enter(run("a", "holder"))
    slots.enter(run("a", "a0"))
    gone = slots.enter(run("b", "b0"))
    slots.enter(run("a", "a1", created=at(9)))
    slots.queue.leave(gone)
    assert slots.queue.waiting_in("b") == 0
    assert slots.release(2) == ["a0", "a1"]


async def test_leaving_a_held_slot_frees_it_and_leaving_again_frees_nothing() -> None:
    queue = FairQueue(2)
    first, second = queue.enter(run("a", "r1")), queue.enter(run("a", "r2"))
    queue.leave(first)
    queue.leave(first)
    assert queue.busy == 1
    assert queue.enter(run("a", "r3")).holding
    assert not queue.enter(run("a", "r4")).holding
    assert second.holding


async def test_every_waiting_run_is_told_its_position_each_time_it_changes_and_only_then() -> None:
    queue = FairQueue(1)
    told = Positions()
    holder = queue.enter(run("a", "holder"))
    tickets = {}
    for name, namespace in (("a0", "a"), ("a1", "a"), ("b0", "b")):
        tickets[name] = queue.enter(run(namespace, name), told.callback(name))
    await settled()
    assert (told.of("a0"), told.of("a1"), told.of("b0")) == ([1], [3], [2])
    queue.leave(holder)  # a0 runs; a's turn is over: b0 next, then a1
    await settled()
    assert (told.of("a0"), told.of("a1"), told.of("b0")) == ([1], [3, 2], [2, 1])
    queue.enter(run("c", "c0"), told.callback("c0"))
    await settled()
    assert told.of("c0") == [3] and told.of("a1") == [3, 2], "a newcomer behind a1 moves nobody"


async def test_a_burst_of_arrivals_is_counted_once_not_once_per_run() -> None:
    queue = FairQueue(1)
    queue.enter(run("a", "holder"))
    told = Positions()
    for i in range(50):
        queue.enter(run(f"ns{i % 5}", f"r{i}", created=at(i)), told.callback(f"r{i}"))
    await settled()
    assert all(len(told.of(f"r{i}")) == 1 for i in range(50)), "each run told once, its final place"
    assert sorted(p for i in range(50) for p in told.of(f"r{i}")) == list(range(1, 51))


async def test_a_failing_position_callback_does_not_keep_the_others_from_hearing_theirs() -> None:
    queue = FairQueue(1)
    queue.enter(run("a", "holder"))
    heard: list[int] = []

    def broken(position: int) -> None:
        raise RuntimeError("boom")

    queue.enter(run("a", "r0"), broken)
    queue.enter(run("a", "r1", created=at(9)), heard.append)
    await settled()
    assert heard == [2]


async def test_positions_predict_the_order_in_which_slots_are_given_across_many_namespaces() -> None:
    rng = random.Random(18)
    slots = Slots(4)
    for i in range(4):
        slots.enter(run("h", f"h{i}"))
    for i in range(300):
        namespace = f"team-{rng.randrange(12)}"
        priority = rng.choice((0, 0, 5))
        slots.enter(run(namespace, f"r{i}", created=at(rng.randrange(600)), priority=priority))
    predicted = slots.queue.positions()
    assert sorted(predicted.values()) == list(range(1, 301))
    granted = [slots.release_one() for _ in range(300)]
    assert [predicted[t.run.uid] for t in granted] == list(range(1, 301))
    assert slots.queue.waiting == 0 and slots.queue.busy == 4


async def test_no_namespace_waits_more_than_one_rotation_for_its_next_slot() -> None:
    rng = random.Random(7)
    slots = Slots(2)
    for i in range(2):
        slots.enter(run("h", f"h{i}"))
    sizes = {"big": 500, "mid": 40, "small": 3, "one": 1}
    for namespace, size in sizes.items():
        for i in range(size):
            slots.enter(run(namespace, f"{namespace}{i}", created=at(rng.randrange(3600))))
    order = [slots.release_one().run.namespace for _ in range(sum(sizes.values()))]
    for namespace, size in sizes.items():
        served = [i for i, ns in enumerate(order) if ns == namespace]
        assert len(served) == size
        assert served[0] < len(sizes), f"{namespace} got its first slot only at {served[0]}"
        gaps = [b - a for a, b in itertools.pairwise(served)]
        assert all(gap <= len(sizes) for gap in gaps), (namespace, max(gaps))


def test_a_queue_without_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        FairQueue(0)
