"""Properties of the ledger over generated histories of several runs and operator processes.

Runs are admitted and released; their requests are reserved (by one of several holders: operator
processes and executions), settled to at most what they reserved, or charged in full when their
holder is found gone; the clock moves on by seconds to days; and every so often the ledger is
written and read back, as another process would. Whatever happens:

- no limit is ever passed: admitted <= concurrentRuns, window runs <= runs, and for tokens and
  dollars used + reserved <= the limit (so used alone never passes it);
- a request refused for good did not fit against used alone; one told to wait fits against used
  alone but not with what is reserved;
- a ledger written and read back after every change behaves exactly as one that never was: the
  status loses nothing.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun.quotas.ledger import Admitted, Blocked, Ledger, QuotaDefinition, Reserved
from tests.unit.quotas.quota_objects import definition

PROPERTY_SETTINGS = settings(
    deadline=None,
    max_examples=int(os.environ.get("AGENTRUN_PROPERTY_EXAMPLES", "150")),
    derandomize=os.environ.get("CI", "").lower() == "true",
    suppress_health_check=[HealthCheck.too_slow],
)
UIDS = ("u1", "u2", "u3", "u4", "u5")
HOLDERS = ("op-a/1", "op-a/2", "op-b/1")
START = dt.datetime(2026, 12, 30, 23, 50, 0, 250_000, tzinfo=dt.UTC)  # the year turns during a history


@dataclass(frozen=True)
class Op:
    kind: str
    run: int
    holder: int
    tokens: int
    millidollars: int | None
    share: int  # settle: quarters of the reservation actually used
    seconds: float


OPS = st.builds(
    Op,
    kind=st.sampled_from(
        ["admit", "release", "reserve", "reserve", "reserve", "settle", "settle", "lost", "wait"]
    ),
    run=st.integers(0, len(UIDS) - 1),
    holder=st.integers(0, len(HOLDERS) - 1),
    tokens=st.integers(0, 600),
    millidollars=st.one_of(st.none(), st.integers(0, 700)),
    share=st.integers(0, 4),
    seconds=st.one_of(
        st.floats(0, 120, allow_nan=False), st.floats(0, 4 * 86_400, allow_nan=False), st.just(0.000001)
    ),
)
HARD = st.fixed_dictionaries(
    {},
    optional={
        "concurrentRuns": st.integers(0, 4),
        "runs": st.integers(0, 6),
        "tokens": st.integers(0, 2000),
        "costUSD": st.sampled_from(["0", "0.5", "1.25", "2"]),
    },
)


def _check_limits(quota: QuotaDefinition, ledger: Ledger, now: dt.datetime) -> None:
    hard, used, reserved = quota.hard, ledger.used(now), ledger.reserved()
    status = ledger.status(now, None)
    if hard.concurrent_runs is not None:
        assert status["used"]["concurrentRuns"] <= hard.concurrent_runs
    if hard.runs is not None:
        assert used.runs <= hard.runs
    if hard.tokens is not None:
        assert used.tokens + reserved.tokens <= hard.tokens
    if hard.cost_usd is not None:
        assert used.cost_usd + reserved.cost_usd <= hard.cost_usd


def _apply(ledger: Ledger, op: Op, now: dt.datetime, serial: int) -> object:
    uid = UIDS[op.run]
    if op.kind == "admit":
        return ledger.admit(uid, f"run-{op.run}", now)
    if op.kind == "release":
        ledger.release(uid)
        return None
    if op.kind == "reserve":
        cost = None if op.millidollars is None else Decimal(op.millidollars) / 1000
        return ledger.reserve(uid, f"run-{op.run}", f"req-{serial}", HOLDERS[op.holder], op.tokens, cost, now)
    if op.kind == "settle":
        held = sorted(ledger.status(now, None)["reservations"], key=lambda r: (r["uid"], r["id"]))
        if not held:
            return None
        target = held[op.run % len(held)]
        share = Decimal(op.share) / 4
        tokens = int(target["tokens"] * op.share // 4)
        cost = None if op.millidollars is None else Decimal(target["costUSD"]) * share
        ledger.settle(target["uid"], target["id"], tokens, cost, now)
        return None
    if op.kind == "lost":
        keep = None if op.holder == 0 else HOLDERS[op.holder]
        return ledger.charge_lost(uid, keep_holder=keep, now=now)
    return None


@PROPERTY_SETTINGS
@given(
    window=st.sampled_from(["Hour", "Day", "Month"]),
    hard=HARD,
    ops=st.lists(OPS, max_size=60),
)
def test_no_history_of_admissions_reservations_settlements_and_losses_passes_a_limit(
    window: str, hard: dict[str, object], ops: list[Op]
) -> None:
    quota = definition(window=window, hard=hard)
    ledger = Ledger(quota)
    now = START
    for serial, op in enumerate(ops):
        if op.kind == "wait":
            now += dt.timedelta(seconds=op.seconds)
        before_used, before_reserved = ledger.used(now), ledger.reserved()
        outcome = _apply(ledger, op, now, serial)
        if isinstance(outcome, Blocked) and op.kind == "reserve":
            want: dict[str, int | Decimal] = {
                "tokens": op.tokens,
                "costUSD": Decimal(op.millidollars or 0) / 1000,
            }
            limit_hard = quota.hard.tokens if outcome.limit == "tokens" else quota.hard.cost_usd
            assert limit_hard is not None
            spent = before_used.tokens if outcome.limit == "tokens" else before_used.cost_usd
            held = before_reserved.tokens if outcome.limit == "tokens" else before_reserved.cost_usd
            if outcome.final and op.millidollars is not None:
                assert spent + want[outcome.limit] > limit_hard
            elif not outcome.final:
                assert spent + want[outcome.limit] <= limit_hard < spent + held + want[outcome.limit]
        _check_limits(quota, ledger, now)


@PROPERTY_SETTINGS
@given(
    window=st.sampled_from(["Hour", "Day", "Month"]),
    hard=HARD,
    ops=st.lists(OPS, max_size=60),
)
def test_a_ledger_written_and_read_back_after_every_change_behaves_as_one_that_never_was(
    window: str, hard: dict[str, object], ops: list[Op]
) -> None:
    quota = definition(window=window, hard=hard)
    kept, reread = Ledger(quota), Ledger(quota)
    now = START
    for serial, op in enumerate(ops):
        if op.kind == "wait":
            now += dt.timedelta(seconds=op.seconds)
        reread = Ledger.load(quota, reread.status(now, 7), now)
        outcome = _apply(kept, op, now, serial)
        assert _apply(reread, op, now, serial) == outcome
        assert outcome is None or isinstance(outcome, Admitted | Reserved | Blocked | int)
        status = kept.status(now, 7)
        assert reread.status(now, 7) == status
        assert Ledger.load(quota, status, now).status(now, 7) == status


@PROPERTY_SETTINGS
@given(
    window=st.sampled_from(["Hour", "Day", "Month"]),
    limit=st.sampled_from(["runs", "tokens"]),
    hard=st.integers(1, 5),
    gaps=st.lists(st.floats(0, 3 * 3600, allow_nan=False), min_size=1, max_size=8),
    wait=st.floats(0, 2 * 86_400, allow_nan=False),
)
def test_room_is_promised_for_the_earliest_instant_it_appears_and_is_there_then(
    window: str, limit: str, hard: int, gaps: list[float], wait: float
) -> None:
    quota = definition(window=window, hard={limit: hard})
    ledger = Ledger(quota)
    now = START
    for index, gap in enumerate(gaps):  # one run started, or one token spent, at each instant
        now += dt.timedelta(seconds=gap)
        if limit == "runs":
            ledger.admit(f"u{index}", "run", now)
        else:
            ledger.reserve("u", "run", f"r{index}", "op/1", 1, None, now)
            ledger.settle("u", f"r{index}", 1, None, now)
    now += dt.timedelta(seconds=wait)
    status = ledger.status(now, None)
    blocked = Ledger.load(quota, status, now).admit("next", "run", now)
    if not isinstance(blocked, Blocked):
        return
    assert blocked.limit == limit
    assert blocked.room_at is not None
    assert blocked.room_at > now
    assert blocked.room_at.isoformat() in blocked.message.replace("Z", "+00:00")
    just_before = blocked.room_at - dt.timedelta(microseconds=1)
    if just_before >= now:
        assert isinstance(Ledger.load(quota, status, now).admit("next", "run", just_before), Blocked)
    assert Ledger.load(quota, status, now).admit("next", "run", blocked.room_at) == Admitted()
