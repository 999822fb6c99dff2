"""One quota's ledger: who is admitted, what is reserved, what the window has used.

Pure: no clock (every operation is given ``now``), no I/O. The controller loads a working copy from
the quota's status, applies a batch of changes and writes ``status()`` back with the object's
resourceVersion; on a conflict it loads the newer status and applies the same changes again. Every
operation is therefore a function of the ledger and ``now`` alone, and idempotent where a change
may be applied to a status that already holds it (admission per uid, reservation per request id).

Why the limits hold under concurrency: a request is sent only once its most possible cost is
reserved, and a reservation is made only when used + reserved + it stays within the limit, so
used + reserved never passes it as long as every request settles to no more than it reserved.
Checks that hold a run back change nothing, so re-checking a waiting run never writes.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from agentrun.api.quota import (
    AgentRunQuotaStatus,
    QuotaAdmission,
    QuotaAdmittedSandbox,
    QuotaBucket,
    QuotaLost,
    QuotaRefusals,
    QuotaReservation,
    QuotaReserved,
    QuotaSummary,
    QuotaUsed,
)
from agentrun.api.times import rfc3339
from agentrun.quotas import messages
from agentrun.quotas.definitions import (
    Hard,
    PerRunLimit,
    QuotaDefinition,
    QuotaSpecError,
)
from agentrun.quotas.formats import cents_text, decimal_text, to_second, utc
from agentrun.quotas.loading import load_state
from agentrun.quotas.outcomes import Admitted, Blocked, Reserved
from agentrun.quotas.quantities import cpu_text, memory_text
from agentrun.quotas.records import (
    ZERO,
    AdmittedRun,
    LedgerState,
    Lost,
    Refused,
    Reservation,
    SandboxUse,
    Tally,
)
from agentrun.quotas.windows import Window, bucket_expiry, bucket_start, counts, window_start

__all__ = [
    "Admitted",
    "Blocked",
    "Hard",
    "Ledger",
    "PerRunLimit",
    "QuotaDefinition",
    "QuotaSpecError",
    "Reserved",
    "SandboxUse",
    "Window",
]


class Ledger:
    """A mutable working copy of one quota's status."""

    def __init__(self, definition: QuotaDefinition, state: LedgerState | None = None) -> None:
        self.definition = definition
        self._state = state if state is not None else LedgerState()

    @classmethod
    def load(cls, definition: QuotaDefinition, status: Mapping[str, Any] | None, now: dt.datetime) -> Ledger:
        """The ledger a status describes; unreadable parts are read conservatively (see loading)."""
        return cls(definition, load_state(definition, status, now))

    # Reading ------------------------------------------------------------------------------------

    def used(self, now: dt.datetime) -> Tally:
        """Runs started, tokens and dollars in the window at ``now``."""
        window = self.definition.window
        return sum((u for s, u in self._state.buckets.items() if counts(window, s, now)), Tally())

    def reserved(self) -> Tally:
        """Tokens and dollars held by requests in flight (runs is always 0)."""
        held = self._state.reservations.values()
        return Tally(tokens=sum(r.tokens for r in held), cost_usd=sum((r.cost_usd for r in held), ZERO))

    def sandboxes(self) -> tuple[int, SandboxUse]:
        """How many admitted runs hold a sandbox, and their CPU and memory limits summed."""
        held = [a.sandbox for a in self._state.admitted.values() if a.sandbox is not None]
        return len(held), SandboxUse(
            cpu=sum((s.cpu for s in held), ZERO), memory=sum((s.memory for s in held), ZERO)
        )

    def uids(self) -> set[str]:
        """Runs with an admission or a reservation here: what the quota reconciler checks are alive."""
        return set(self._state.admitted) | {uid for uid, _ in self._state.reservations}

    def status(self, now: dt.datetime, generation: int | None) -> dict[str, Any]:
        """The whole status, built from its API model (api/quota.py) so it cannot drift from the CRD's
        schema; expired buckets are dropped."""
        window = self.definition.window
        state = self._state
        state.buckets = {s: u for s, u in state.buckets.items() if counts(window, s, now) and not u.empty}
        used, reserved, hard = self.used(now), self.reserved(), self.definition.hard
        sandboxes, sandbox_use = self.sandboxes()
        shown = sandboxes > 0 or any(
            limit is not None for limit in (hard.concurrent_sandboxes, hard.sandbox_cpu, hard.sandbox_memory)
        )
        status = AgentRunQuotaStatus(
            observed_generation=generation,
            window_start=rfc3339(window_start(window, now)),
            used=QuotaUsed(
                concurrent_runs=len(state.admitted),
                runs=used.runs,
                tokens=used.tokens,
                costUSD=decimal_text(used.cost_usd),
                concurrent_sandboxes=sandboxes if shown else None,
                sandboxCPU=cpu_text(sandbox_use.cpu) if shown else None,
                sandboxMemory=memory_text(sandbox_use.memory) if shown else None,
            ),
            reserved=QuotaReserved(tokens=reserved.tokens, costUSD=decimal_text(reserved.cost_usd)),
            summary=QuotaSummary(
                concurrent_runs=_summary(str(len(state.admitted)), hard.concurrent_runs),
                runs=_summary(str(used.runs), hard.runs),
                tokens=_summary(str(used.tokens), hard.tokens),
                costUSD=_summary(cents_text(used.cost_usd, below=hard.cost_usd), hard.cost_usd),
                concurrent_sandboxes=_summary(str(sandboxes), hard.concurrent_sandboxes) if shown else None,
                sandboxCPU=_quantity_summary(sandbox_use.cpu, hard.sandbox_cpu, cpu_text) if shown else None,
                sandboxMemory=(
                    _quantity_summary(sandbox_use.memory, hard.sandbox_memory, memory_text) if shown else None
                ),
            ),
            admitted=[_admission(a) for a in state.admitted.values()],
            reservations=[_reservation(r) for r in state.reservations.values()],
            buckets=[
                QuotaBucket(start=rfc3339(s), runs=u.runs, tokens=u.tokens, costUSD=decimal_text(u.cost_usd))
                for s, u in sorted(state.buckets.items())
            ],
            lost=QuotaLost(
                requests=state.lost.requests,
                tokens=state.lost.tokens,
                costUSD=decimal_text(state.lost.cost_usd),
            ),
            refused=QuotaRefusals(runs=state.refused.runs, requests=state.refused.requests),
        )
        # None is left out: observedGeneration before the quota's generation is known, the sandbox
        # counts of a quota that neither limits nor holds a sandbox, an admission without a sandbox.
        return status.model_dump(by_alias=True, mode="json", exclude_none=True)

    # Runs ---------------------------------------------------------------------------------------

    def admit(
        self,
        uid: str,
        name: str,
        now: dt.datetime,
        *,
        need_tokens: int = 0,
        need_cost_usd: Decimal = ZERO,
        sandbox: SandboxUse | None = None,
    ) -> Admitted | Blocked:
        """Count the run in concurrentRuns and the window's runs, if every limit has room.

        ``need_*``: the least the run's first request can reserve. A run admitted without room for
        it would only end QuotaExceeded at once; it waits for the window instead. ``sandbox``: the
        limits of the run's sandbox, counted while it is admitted (a run without one, None, is not
        held back by the sandbox limits). A run already admitted (a resumed one, or a change applied
        again after a conflict) is admitted again without counting twice. Blocked changes nothing.
        """
        if uid in self._state.admitted:
            return Admitted()
        blocked = self._admission_blocked(now, Tally(tokens=need_tokens, cost_usd=need_cost_usd), sandbox)
        if blocked is not None:
            return blocked
        self._state.admitted[uid] = AdmittedRun(uid=uid, name=name, at=to_second(now), sandbox=sandbox)
        self._book(now, Tally(runs=1))
        return Admitted()

    def release(self, uid: str) -> None:
        """The run finished (or is gone): it no longer counts in concurrentRuns. Its starts still do."""
        self._state.admitted.pop(uid, None)

    def count_refused_run(self) -> None:
        """One more run held back by this quota, for status.refused.runs.

        Why not counted by admit: a waiting run is checked again at every change of the quota, and
        a check that wrote would be a change of its own. The caller counts a run once, when it
        first holds it back.
        """
        refused = self._state.refused
        self._state.refused = Refused(runs=refused.runs + 1, requests=refused.requests)

    # Requests -----------------------------------------------------------------------------------

    def reserve(
        self,
        uid: str,
        name: str,
        request_id: str,
        holder: str,
        tokens: int,
        cost_usd: Decimal | None,
        now: dt.datetime,
    ) -> Reserved | Blocked:
        """Hold the most a model request may cost, if it fits with what others hold.

        ``cost_usd`` None: the model has no price, which only a costUSD limit refuses. A refusal
        that ends the run (final) is counted in status.refused.requests; a wait changes nothing.
        """
        if tokens < 0 or (cost_usd is not None and cost_usd < 0):
            raise ValueError(f"a reservation cannot be negative (tokens {tokens}, costUSD {cost_usd})")
        if (uid, request_id) in self._state.reservations:
            return Reserved()
        label, window, hard = self.definition.label, self.definition.window, self.definition.hard
        if cost_usd is None and hard.cost_usd is not None:
            return self._refuse(Blocked("costUSD", messages.unpriced(label, hard.cost_usd), None, final=True))
        want = Tally(tokens=tokens, cost_usd=cost_usd if cost_usd is not None else ZERO)
        used, reserved = self.used(now), self.reserved()
        checked = [(limit, read, _hard_of(hard, limit)) for limit, read in _SPENDS]
        for limit, read, limit_hard in checked:
            if limit_hard is not None and read(used) + read(want) > limit_hard:
                room_at = self._room_at(now, _within(read, read(want), limit_hard, strictly=False))
                message = messages.request_too_big(
                    label, limit, window, read(want), read(used), limit_hard, room_at
                )
                return self._refuse(Blocked(limit, message, room_at, final=True))
        for limit, read, limit_hard in checked:
            if limit_hard is not None and read(used) + read(reserved) + read(want) > limit_hard:
                message = messages.request_waits(
                    label, limit, read(want), read(used), read(reserved), limit_hard
                )
                return Blocked(limit, message, None, final=False)
        self._state.reservations[(uid, request_id)] = Reservation(
            uid=uid,
            name=name,
            id=request_id,
            holder=holder,
            tokens=want.tokens,
            cost_usd=want.cost_usd,
            at=to_second(now),
        )
        return Reserved()

    def settle(
        self, uid: str, request_id: str, tokens: int, cost_usd: Decimal | None, now: dt.datetime
    ) -> None:
        """Replace the reservation by the request's real usage, in the bucket of ``now``.

        An unknown id is a settlement already applied (or a reservation already charged): no-op.
        ``cost_usd`` None: no price known, so the reserved dollars are charged (never less).
        """
        reservation = self._state.reservations.pop((uid, request_id), None)
        if reservation is None:
            return
        cost = reservation.cost_usd if cost_usd is None else cost_usd
        self._book(now, Tally(tokens=tokens, cost_usd=cost))

    def charge_lost(self, uid: str, *, keep_holder: str | None, now: dt.datetime) -> int:
        """Charge in full the reservations of ``uid`` not held by ``keep_holder``; how many there were.

        Why in full: their holder stopped before it recorded an answer, and the API may have served
        the request all the same; charging less could pass the limit.
        """
        lost = [
            key for key, r in self._state.reservations.items() if r.uid == uid and r.holder != keep_holder
        ]
        for key in lost:
            reservation = self._state.reservations.pop(key)
            charge = Tally(tokens=reservation.tokens, cost_usd=reservation.cost_usd)
            self._book(now, charge)
            before = self._state.lost
            self._state.lost = Lost(
                requests=before.requests + 1,
                tokens=before.tokens + charge.tokens,
                cost_usd=before.cost_usd + charge.cost_usd,
            )
        return len(lost)

    # Inside -------------------------------------------------------------------------------------

    def _admission_blocked(self, now: dt.datetime, need: Tally, sandbox: SandboxUse | None) -> Blocked | None:
        label, window, hard = self.definition.label, self.definition.window, self.definition.hard
        running = len(self._state.admitted)
        if hard.concurrent_runs is not None and running >= hard.concurrent_runs:
            message = messages.concurrent_runs_full(label, running, hard.concurrent_runs)
            return Blocked("concurrentRuns", message, None)
        if sandbox is not None:
            blocked = self._sandbox_blocked(sandbox)
            if blocked is not None:
                return blocked
        used, reserved = self.used(now), self.reserved()
        if hard.runs is not None and used.runs >= hard.runs:
            runs_hard = hard.runs
            room_at = self._room_at(now, lambda usage: usage.runs < runs_hard)
            return Blocked("runs", messages.runs_full(label, window, used.runs, runs_hard, room_at), room_at)
        for limit, read in _SPENDS:
            limit_hard = _hard_of(hard, limit)
            held, needed = read(reserved), read(need)
            if limit_hard is not None and needed > limit_hard:
                # Its first request alone passes the limit: no window will ever have room.
                message = messages.request_too_big(label, limit, window, needed, read(used), limit_hard, None)
                return Blocked(limit, message, None, final=True)
            if limit_hard is None or (
                read(used) + held < limit_hard and read(used) + held + needed <= limit_hard
            ):
                continue
            strictly = not needed  # nothing named: some room left is enough
            room_at = self._room_at(now, _within(read, held + needed, limit_hard, strictly=strictly))
            message = messages.spend_full(
                label, limit, window, read(used), held, limit_hard, room_at, need=needed
            )
            return Blocked(limit, message, room_at)
        return None

    def _sandbox_blocked(self, sandbox: SandboxUse) -> Blocked | None:
        """concurrentSandboxes, sandboxCPU, sandboxMemory: room comes only when a run with a sandbox
        ends (no time to promise); a sandbox bigger than a whole limit never fits (final)."""
        label, hard = self.definition.label, self.definition.hard
        holding, held = self.sandboxes()
        if hard.concurrent_sandboxes is not None and holding >= hard.concurrent_sandboxes:
            message = messages.concurrent_sandboxes_full(label, holding, hard.concurrent_sandboxes)
            return Blocked("concurrentSandboxes", message, None)
        shares = (
            ("sandboxCPU", held.cpu, sandbox.cpu, hard.sandbox_cpu, cpu_text),
            ("sandboxMemory", held.memory, sandbox.memory, hard.sandbox_memory, memory_text),
        )
        for limit, used, need, limit_hard, text in shares:
            if limit_hard is None or used + need <= limit_hard:
                continue
            if need > limit_hard:
                message = messages.sandbox_too_big(label, limit, text(limit_hard), text(need))
                return Blocked(limit, message, None, final=True)
            message = messages.sandbox_share_full(
                label, limit, text(used), holding, text(limit_hard), text(need)
            )
            return Blocked(limit, message, None)
        return None

    def _room_at(self, now: dt.datetime, fits: Callable[[Tally], bool]) -> dt.datetime | None:
        """The earliest time enough buckets have left the window for ``fits`` to hold; None if never."""
        window = self.definition.window
        remaining = self.used(now)
        expiring = sorted(
            ((bucket_expiry(window, start), usage) for start, usage in self._state.buckets.items()),
            key=_expiry,
        )
        for expiry, group in itertools.groupby(expiring, key=_expiry):
            if expiry <= utc(now):
                continue  # already out of the window: not in ``remaining`` either
            remaining -= sum((usage for _, usage in group), Tally())
            if fits(remaining):
                return expiry
        return None

    def _book(self, now: dt.datetime, usage: Tally) -> None:
        if usage.empty:
            return
        start = bucket_start(self.definition.window, now)
        buckets = self._state.buckets
        buckets[start] = buckets.get(start, Tally()) + usage

    def _refuse(self, blocked: Blocked) -> Blocked:
        refused = self._state.refused
        self._state.refused = Refused(runs=refused.runs, requests=refused.requests + 1)
        return blocked


Amount = int | Decimal
Read = Callable[[Tally], Amount]

#: The limits a model request spends, in the order they are checked, and how to read them off a Tally.
_SPENDS: tuple[tuple[str, Read], ...] = (
    ("tokens", lambda usage: usage.tokens),
    ("costUSD", lambda usage: usage.cost_usd),
)


def _expiry(item: tuple[dt.datetime, Tally]) -> dt.datetime:
    return item[0]


def _hard_of(hard: Hard, limit: str) -> Amount | None:
    return hard.tokens if limit == "tokens" else hard.cost_usd


def _within(read: Read, extra: Amount, hard: Amount, *, strictly: bool) -> Callable[[Tally], bool]:
    """Whether a window's usage plus ``extra`` leaves room: below the limit (strictly) or within it."""

    def fits(usage: Tally) -> bool:
        total = read(usage) + extra
        return total < hard if strictly else total <= hard

    return fits


def _summary(used: str, hard: Amount | None) -> str:
    if hard is None:
        return used
    return f"{used}/{hard if isinstance(hard, int) else decimal_text(hard)}"


def _quantity_summary(used: Decimal, hard: Decimal | None, text: Callable[[Decimal], str]) -> str:
    return text(used) if hard is None else f"{text(used)}/{text(hard)}"


def _admission(admitted: AdmittedRun) -> QuotaAdmission:
    """One admission as status.admitted lists it, with its sandbox's limits when it holds one."""
    sandbox = admitted.sandbox
    return QuotaAdmission(
        uid=admitted.uid,
        name=admitted.name,
        at=rfc3339(admitted.at),
        sandbox=None
        if sandbox is None
        else QuotaAdmittedSandbox(cpu=cpu_text(sandbox.cpu), memory=memory_text(sandbox.memory)),
    )


def _reservation(held: Reservation) -> QuotaReservation:
    """One reservation as status.reservations lists it (its dollars always written: "0" when unpriced)."""
    return QuotaReservation(
        uid=held.uid,
        name=held.name,
        id=held.id,
        holder=held.holder,
        tokens=held.tokens,
        costUSD=decimal_text(held.cost_usd),
        at=rfc3339(held.at),
    )
