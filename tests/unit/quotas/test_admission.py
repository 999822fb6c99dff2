"""Admission: a run counts against every limit only when each has room, once, in the contract's order."""

from __future__ import annotations

from decimal import Decimal

from agentrun.quotas.ledger import Admitted, Blocked, Ledger
from tests.unit.quotas.quota_objects import at, definition

NOW = at("2026-11-24T09:20:00Z")


def test_a_run_is_admitted_and_counted_in_concurrent_runs_and_the_window_runs() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 2, "runs": 10}))
    assert ledger.admit("u1", "first", NOW) == Admitted()
    status = ledger.status(NOW, 1)
    assert status["used"]["concurrentRuns"] == 1
    assert status["used"]["runs"] == 1
    assert status["admitted"] == [{"uid": "u1", "name": "first", "at": "2026-11-24T09:20:00Z"}]
    assert status["buckets"] == [{"start": "2026-11-24T09:15:00Z", "runs": 1, "tokens": 0, "costUSD": "0"}]


def test_a_run_admitted_again_after_a_resume_is_not_counted_twice() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 1, "runs": 1}))
    assert ledger.admit("u1", "run", NOW) == Admitted()
    assert ledger.admit("u1", "run", at("2026-11-24T10:00:00Z")) == Admitted()
    assert ledger.used(NOW).runs == 1
    assert ledger.status(NOW, None)["used"]["concurrentRuns"] == 1


def test_concurrent_runs_hold_a_run_back_until_one_ends_with_no_time_to_promise() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 2}))
    ledger.admit("u1", "a", NOW)
    ledger.admit("u2", "b", NOW)
    blocked = ledger.admit("u3", "c", NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.limit == "concurrentRuns"
    assert blocked.room_at is None
    assert blocked.message == (
        "quota research/team: concurrentRuns limit 2 reached (2 running); "
        "room expected when one of the 2 running runs ends"
    )
    ledger.release("u1")
    assert ledger.admit("u3", "c", NOW) == Admitted()


def test_a_release_of_a_run_never_admitted_changes_nothing() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 1}))
    ledger.admit("u1", "a", NOW)
    ledger.release("nobody")
    assert isinstance(ledger.admit("u2", "b", NOW), Blocked)


def test_a_released_run_still_counts_in_the_window_runs_it_started_in() -> None:
    ledger = Ledger(definition(hard={"runs": 1}))
    ledger.admit("u1", "a", NOW)
    ledger.release("u1")
    blocked = ledger.admit("u2", "b", NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.limit == "runs"


def test_window_runs_hold_a_run_back_until_the_oldest_start_leaves_the_rolling_hour() -> None:
    ledger = Ledger(definition(window="Hour", hard={"runs": 2}))
    ledger.admit("u1", "a", at("2026-11-24T09:00:30Z"))
    ledger.admit("u2", "b", at("2026-11-24T09:05:10Z"))
    blocked = ledger.admit("u3", "c", at("2026-11-24T09:30:00Z"))
    assert isinstance(blocked, Blocked)
    assert blocked.room_at == at("2026-11-24T10:01:00Z")  # the 09:00 bucket ends 09:01, plus an hour
    assert blocked.message == (
        "quota research/team: runs limit 2 reached (2 started in the rolling hour); "
        "room expected at 2026-11-24T10:01:00Z"
    )
    assert isinstance(ledger.admit("u3", "c", at("2026-11-24T10:00:59Z")), Blocked)
    assert ledger.admit("u3", "c", at("2026-11-24T10:01:00Z")) == Admitted()


def test_a_month_of_runs_is_held_back_until_the_first_instant_of_the_next_month() -> None:
    ledger = Ledger(definition(window="Month", hard={"runs": 1}))
    ledger.admit("u1", "a", at("2026-12-02T08:00:00Z"))
    blocked = ledger.admit("u2", "b", at("2026-12-31T23:59:59Z"))
    assert isinstance(blocked, Blocked)
    assert blocked.room_at == at("2027-01-01T00:00:00Z")
    assert (
        "runs limit 1 reached (1 started in this calendar month (UTC)); room expected at 2027-01-01T00:00:00Z"
        in (blocked.message)
    )
    assert ledger.admit("u2", "b", at("2027-01-01T00:00:00Z")) == Admitted()


def test_limits_are_checked_in_order_concurrent_runs_then_runs_then_tokens_then_cost() -> None:
    hard = {"concurrentRuns": 1, "runs": 1, "tokens": 10, "costUSD": 1}
    ledger = Ledger(definition(hard=hard))
    ledger.admit("u1", "a", NOW)
    ledger.reserve("u1", "a", "r1", "op/1", 10, Decimal(1), NOW)
    limits = []
    for release in (True, False):
        blocked = ledger.admit("u2", "b", NOW)
        assert isinstance(blocked, Blocked)
        limits.append(blocked.limit)
        if release:
            ledger.release("u1")
    assert limits == ["concurrentRuns", "runs"]
    ledger2 = Ledger(definition(hard={"tokens": 10, "costUSD": 1}))
    ledger2.reserve("u1", "a", "r1", "op/1", 10, Decimal(1), NOW)
    blocked = ledger2.admit("u2", "b", NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.limit == "tokens"
    ledger3 = Ledger(definition(hard={"tokens": 11, "costUSD": 1}))
    ledger3.reserve("u1", "a", "r1", "op/1", 10, Decimal(1), NOW)
    blocked = ledger3.admit("u2", "b", NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.limit == "costUSD"


def test_tokens_reserved_by_requests_in_flight_count_at_admission_and_room_comes_when_they_settle() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    ledger.reserve("u1", "a", "r1", "op/1", 1000, None, NOW)
    blocked = ledger.admit("u2", "b", NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.room_at is None
    assert blocked.message == (
        "quota research/team: tokens limit 1000 reached (0 used + 1000 reserved by requests in flight in "
        "the rolling day); room expected when requests in flight settle"
    )
    ledger.settle("u1", "r1", 400, None, NOW)
    assert ledger.admit("u2", "b", NOW) == Admitted()


def test_a_run_waits_while_the_room_left_is_less_than_its_first_request_needs() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    ledger.reserve("u1", "a", "r1", "op/1", 700, None, at("2026-11-24T09:20:00Z"))
    ledger.settle("u1", "r1", 700, None, at("2026-11-24T09:20:00Z"))
    blocked = ledger.admit("u2", "b", NOW, need_tokens=400)
    assert isinstance(blocked, Blocked)
    assert blocked.limit == "tokens"
    assert blocked.room_at == at("2026-11-25T09:30:00Z")
    assert blocked.message == (
        "quota research/team: tokens limit 1000 has 300 left (700 used in the rolling day), less than the "
        "run's first request needs (400); room expected at 2026-11-25T09:30:00Z"
    )
    assert ledger.used(NOW).runs == 0, "a run held back is not counted"
    assert ledger.admit("u2", "b", NOW, need_tokens=300) == Admitted()


def test_a_run_whose_first_request_alone_passes_the_limit_is_refused_for_good() -> None:
    ledger = Ledger(definition(hard={"tokens": 200}))
    blocked = ledger.admit("u1", "a", NOW, need_tokens=300)
    assert isinstance(blocked, Blocked)
    assert (blocked.limit, blocked.final, blocked.room_at) == ("tokens", True, None)
    assert "more than the whole limit" in blocked.message
    assert ledger.used(NOW).runs == 0


def test_dollars_used_hold_a_run_back_until_they_leave_the_rolling_day() -> None:
    ledger = Ledger(definition(hard={"costUSD": "0.30"}))
    ledger.reserve("u1", "a", "r1", "op/1", 0, Decimal("0.1"), at("2026-11-24T09:20:00Z"))
    ledger.settle("u1", "r1", 0, Decimal("0.1"), at("2026-11-24T09:20:00Z"))
    ledger.reserve("u1", "a", "r2", "op/1", 0, Decimal("0.2"), at("2026-11-24T11:00:00Z"))
    ledger.settle("u1", "r2", 0, Decimal("0.2"), at("2026-11-24T11:00:00Z"))
    blocked = ledger.admit("u2", "b", at("2026-11-24T12:00:00Z"))
    assert isinstance(blocked, Blocked)
    assert blocked.limit == "costUSD"
    assert blocked.room_at == at("2026-11-25T09:30:00Z")
    assert (
        "costUSD limit 0.3 reached (0.3 used in the rolling day); room expected at 2026-11-25T09:30:00Z"
        in (blocked.message)
    )


def test_a_limit_of_zero_admits_nothing_and_promises_no_room() -> None:
    ledger = Ledger(definition(hard={"runs": 0}))
    blocked = ledger.admit("u1", "a", NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.room_at is None
    assert blocked.message.endswith("room expected only when the quota is raised")
    concurrent = Ledger(definition(hard={"concurrentRuns": 0})).admit("u1", "a", NOW)
    assert isinstance(concurrent, Blocked)
    assert concurrent.message.endswith("room expected only when the quota is raised")


def test_holding_a_run_back_changes_nothing_so_rechecking_a_waiting_run_never_writes() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 1, "runs": 5}))
    ledger.admit("u1", "a", NOW)
    before = ledger.status(NOW, 1)
    for _ in range(3):
        assert isinstance(ledger.admit("u2", "b", NOW), Blocked)
    assert ledger.status(NOW, 1) == before


def test_a_run_held_back_is_counted_once_by_whoever_holds_it_back() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 0}))
    ledger.count_refused_run()
    assert ledger.status(NOW, None)["refused"] == {"runs": 1, "requests": 0}


def test_a_quota_without_hard_limits_admits_every_run() -> None:
    ledger = Ledger(definition(hard={}))
    for index in range(50):
        assert ledger.admit(f"u{index}", "r", NOW) == Admitted()
    assert ledger.uids() == {f"u{index}" for index in range(50)}
