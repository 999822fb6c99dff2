"""A namespace's line of runs waiting for quota, over every replica, and who in it may write now.

Why one line over the replicas: each replica executes the runs it owns, but the quotas of a namespace
are shared, so a line per replica let each replica admit its own first run: the runs of one replica
overtook older or more urgent ones of another. Every replica watches every run, and a run waiting for
quota says in its status what holds it (status.quotaWait), so every replica can put the runs waiting
elsewhere in its line too; only their owner writes their admission.

Why a line and not only its first run: when a quota has room for many, one admission per ledger write
made a thousand runs wait for a thousand writes in turn, each of them rewriting its "runs ahead of it"
message meanwhile. The runs at the front that the ledgers (as last read) have room for all write
together, and the ledger writer carries them in one write (writing.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agentrun.quotas.ledger import Admitted, Blocked, Ledger, QuotaDefinition, SandboxUse
from agentrun.quotas.outcomes import SANDBOX_LIMITS

#: status.quotaWait.limit of a run that waits for runs ahead of it, not for a full limit.
ORDER = "order"


@dataclass(frozen=True)
class Candidate:
    """A run asking for admission, as the namespace's line orders it."""

    namespace: str
    name: str
    uid: str
    created: str = ""
    priority: int = 0
    # The least the run's first request reserves (loop/reserving.py first_request_floor): admitted
    # only with that much room, so it does not start just to be refused at once.
    need_tokens: int = 0
    need_cost_usd: Decimal = Decimal(0)
    # The limits of its sandbox (spec.sandbox.resources.limits), counted by the sandbox limits while
    # it is admitted; None for a run without a sandbox, which those limits do not hold back.
    sandbox: SandboxUse | None = None

    def order(self) -> tuple[int, str, str, str]:
        return (-self.priority, self.created, self.name, self.uid)


@dataclass(frozen=True)
class Elsewhere:
    """A run another replica (or this one, before it reached admission here) says waits for quota."""

    namespace: str
    name: str
    uid: str
    created: str
    priority: int
    #: What holds it back, from its status.quotaWait.limit: a sandbox limit holds back only runs with one.
    limit: str

    def order(self) -> tuple[int, str, str, str]:
        return (-self.priority, self.created, self.name, self.uid)

    @property
    def sandbox_bound(self) -> bool:
        return self.limit in SANDBOX_LIMITS


@dataclass(frozen=True)
class HeldBack:
    """What holds a waiting run back on one look, and when room may come (None: no time to promise)."""

    message: str
    #: (quota, limit) that is full, or ("", "order") for runs ahead of it in the namespace's line.
    cause: tuple[str, str]
    room_at: dt.datetime | None = None


@dataclass
class Announcements:
    """What a waiting run last said about why it waits, and when.

    A new reason (another quota or limit) is said at once, new numbers of the same reason (usage,
    runs ahead) at most once per ``interval`` seconds: else every settled request of a namespace
    would rewrite the status of every run waiting there.
    """

    interval: float
    message: str | None = None
    cause: tuple[str, str] | None = None
    at: dt.datetime | None = None

    def due(self, held: HeldBack, now: dt.datetime) -> bool:
        """Whether ``held`` is to be said at ``now``: it says something new, and may say it now."""
        if held.message == self.message:
            return False
        return held.cause != self.cause or self.at is None or (now - self.at).total_seconds() >= self.interval

    def record(self, held: HeldBack, now: dt.datetime) -> None:
        """``held`` was said at ``now``."""
        self.message, self.cause, self.at = held.message, held.cause, now


@dataclass
class Queue:
    """This replica's runs waiting for quota in one namespace, and the runs it knows wait elsewhere."""

    waiting: list[Candidate] = field(default_factory=list)
    elsewhere: dict[str, Elsewhere] = field(default_factory=dict)
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    #: Runs whose last look found a sandbox limit full (concurrentSandboxes, sandboxCPU, sandboxMemory).
    sandbox_bound: set[str] = field(default_factory=set)
    #: Counts every change of the line, for the lineup's cache.
    version: int = 0

    def enter(self, run: Candidate) -> None:
        self.waiting.append(run)
        self.waiting.sort(key=Candidate.order)
        self.version += 1

    def leave(self, run: Candidate) -> None:
        self.waiting = [r for r in self.waiting if r.uid != run.uid]
        self.sandbox_bound.discard(run.uid)
        self._moved()

    def saw_elsewhere(self, run: Elsewhere | None, uid: str) -> None:
        """A run waiting elsewhere (None: it no longer waits): runs behind it look again when it leaves."""
        if run is None:
            if self.elsewhere.pop(uid, None) is not None:
                self._moved()
        elif self.elsewhere.get(uid) != run:
            self.elsewhere[uid] = run
            self.version += 1

    def line(self, admitted: Collection[str] = ()) -> list[Candidate | Elsewhere]:
        """Every run known to wait in the namespace, in admission order, each once: this replica's own
        entry wins over what its status last said, and a run the ledgers list as ``admitted`` waits
        no more whatever its status says still."""
        here = {run.uid for run in self.waiting}
        others = [run for uid, run in self.elsewhere.items() if uid not in here and uid not in admitted]
        return sorted([*self.waiting, *others], key=lambda run: run.order())

    def only_sandbox_holds(self, run: Candidate | Elsewhere) -> bool:
        """Whether only a sandbox limit holds ``run`` back (as its last look, or its status, said)."""
        return run.sandbox_bound if isinstance(run, Elsewhere) else run.uid in self.sandbox_bound

    def held_by(self, run: Candidate, limit: str) -> None:
        """What held ``run`` back on its last look; runs behind it look again when that changes
        between a sandbox limit and any other (they may pass it now, or must wait behind it)."""
        bound = limit in SANDBOX_LIMITS
        if bound == (run.uid in self.sandbox_bound):
            return
        if bound:
            self.sandbox_bound.add(run.uid)
        else:
            self.sandbox_bound.discard(run.uid)
        self._moved()

    def reprioritise(self, uid: str, priority: int) -> Candidate | None:
        """The run's new place after a change of spec.priority (the new Candidate), if it waits here."""
        for index, run in enumerate(self.waiting):
            if run.uid == uid:
                self.waiting[index] = moved = dataclasses.replace(run, priority=priority)
                self.waiting.sort(key=Candidate.order)
                self._moved()
                return moved
        return None

    def _moved(self) -> None:
        self.version += 1
        moved, self.moved = self.moved, asyncio.Event()
        moved.set()


@dataclass(frozen=True)
class Lineup:
    """The namespace's line as of one version of it and of the quotas: worked out once per change, not
    once per waiting run (each of which looks at every change)."""

    #: uid → (runs ahead of it, runs ahead of it that not only a sandbox limit holds back).
    places: Mapping[str, tuple[int, int]]
    #: This replica's runs that may write their admission now (``writers``).
    front: frozenset[str]

    @classmethod
    def of(cls, queue: Queue, objects: Sequence[Mapping[str, Any]], now: dt.datetime) -> Lineup:
        admitted = {uid for obj in objects for uid in admitted_uids(obj)}
        line = queue.line(admitted)
        places: dict[str, tuple[int, int]] = {}
        unbound = 0
        for index, run in enumerate(line):
            places[run.uid] = (index, unbound)
            if not queue.only_sandbox_holds(run):
                unbound += 1
        return cls(places, writers(line, objects, now))

    def ahead_of(self, run: Candidate) -> int:
        """How many runs wait ahead of ``run`` for room it needs too. A run without a sandbox is not
        held back by the sandbox limits, so runs that only those hold back are not ahead of it."""
        before, unbound = self.places.get(run.uid, (0, 0))
        return before if run.sandbox is not None else unbound


def admitted_uids(obj: Mapping[str, Any]) -> list[str]:
    """The runs a quota object's status lists as admitted."""
    admitted = (obj.get("status") or {}).get("admitted") or []
    return [str(entry.get("uid")) for entry in admitted if isinstance(entry, Mapping)]


def writers(
    line: Iterable[Candidate | Elsewhere], objects: Sequence[Mapping[str, Any]], now: dt.datetime
) -> frozenset[str]:
    """This replica's runs that may write their admission now: the front of the line, as far as the
    ledgers (as last read) have room for each run after the ones before it.

    The line stops at the first run the ledgers hold back, and at the first run waiting elsewhere
    (its owner admits it; the runs behind it look again once it left the line). A run held back by a
    sandbox limit holds back only the runs with a sandbox behind it.
    """
    ledgers = [Ledger.load(QuotaDefinition.from_object(obj), obj.get("status"), now) for obj in objects]
    allowed: set[str] = set()
    sandboxes_closed = False
    for run in line:
        if isinstance(run, Elsewhere):
            if not run.sandbox_bound:
                break
            sandboxes_closed = True
            continue
        if sandboxes_closed and run.sandbox is not None:
            continue
        limit = _first_full(run, ledgers, now)
        if limit is None:
            allowed.add(run.uid)
        elif limit in SANDBOX_LIMITS:
            sandboxes_closed = True
        else:
            break
    return frozenset(allowed)


def _first_full(run: Candidate, ledgers: Sequence[Ledger], now: dt.datetime) -> str | None:
    """The first limit that holds ``run`` back, counting it in every ledger that admits it."""
    for ledger in ledgers:
        verdict = admit(run, ledger, now)
        if not isinstance(verdict, Admitted):
            return verdict.limit
    return None


def admit(run: Candidate, ledger: Ledger, now: dt.datetime) -> Admitted | Blocked:
    """``run`` admitted by ``ledger``, or what holds it back: the same question when judging the line,
    a listing, and when writing."""
    return ledger.admit(
        run.uid,
        run.name,
        now,
        need_tokens=run.need_tokens,
        need_cost_usd=run.need_cost_usd,
        sandbox=run.sandbox,
    )
