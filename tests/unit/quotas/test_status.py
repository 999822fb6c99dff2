"""The status: the shape the contract gives it, and a ledger read back from it by another process."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any

import pytest

from agentrun.quotas.ledger import (
    Admitted,
    Blocked,
    Ledger,
    QuotaDefinition,
    QuotaSpecError,
    Window,
)
from tests.unit.quotas.quota_objects import at, definition, quota_object

NOW = at("2026-11-24T09:20:00Z")
HARD = {"concurrentRuns": 5, "runs": 100, "tokens": 2_000_000, "costUSD": 50}


def _busy_ledger(window: str = "Day") -> Ledger:
    ledger = Ledger(definition(window=window, hard=HARD))
    ledger.admit("u1", "first", at("2026-11-24T08:59:00Z"))
    ledger.admit("u2", "second", NOW)
    ledger.reserve("u1", "first", "r1", "op/1", 8192, Decimal("0.05"), at("2026-11-24T09:00:00Z"))
    ledger.settle("u1", "r1", 12345, Decimal("0.123456"), at("2026-11-24T09:01:00Z"))
    ledger.reserve("u2", "second", "r1", "op/2", 8192, Decimal("0.05"), NOW)
    ledger.reserve("gone", "third", "r9", "op/0", 5000, Decimal("0.02"), NOW)
    ledger.charge_lost("gone", keep_holder=None, now=NOW)
    return ledger


#: _busy_ledger's status at NOW, generation 3, keys in the order the ledger has always written them.
BUSY_STATUS = {
    "observedGeneration": 3,
    "windowStart": "2026-11-23T09:20:00Z",
    "used": {"concurrentRuns": 2, "runs": 2, "tokens": 17345, "costUSD": "0.143456"},
    "reserved": {"tokens": 8192, "costUSD": "0.05"},
    "summary": {
        "concurrentRuns": "2/5",
        "runs": "2/100",
        "tokens": "17345/2000000",
        "costUSD": "0.14/50",
    },
    "admitted": [
        {"uid": "u1", "name": "first", "at": "2026-11-24T08:59:00Z"},
        {"uid": "u2", "name": "second", "at": "2026-11-24T09:20:00Z"},
    ],
    "reservations": [
        {
            "uid": "u2",
            "name": "second",
            "id": "r1",
            "holder": "op/2",
            "tokens": 8192,
            "costUSD": "0.05",
            "at": "2026-11-24T09:20:00Z",
        }
    ],
    "buckets": [
        {"start": "2026-11-24T08:45:00Z", "runs": 1, "tokens": 0, "costUSD": "0"},
        {"start": "2026-11-24T09:00:00Z", "runs": 0, "tokens": 12345, "costUSD": "0.123456"},
        {"start": "2026-11-24T09:15:00Z", "runs": 1, "tokens": 5000, "costUSD": "0.02"},
    ],
    "lost": {"requests": 1, "tokens": 5000, "costUSD": "0.02"},
    "refused": {"runs": 0, "requests": 0},
}


def test_the_status_holds_every_part_of_the_contract_byte_for_byte_in_its_order() -> None:
    # As JSON text, key order included: the status built from the API model is what the dict literal
    # it replaced wrote, so no stored quota status changes shape under an upgrade.
    assert json.dumps(_busy_ledger().status(NOW, 3)) == json.dumps(BUSY_STATUS)


def test_a_status_without_a_generation_has_no_observed_generation_and_shows_every_zero() -> None:
    assert json.dumps(Ledger(definition(hard={})).status(NOW, None)) == json.dumps(
        {
            "windowStart": "2026-11-23T09:20:00Z",
            "used": {"concurrentRuns": 0, "runs": 0, "tokens": 0, "costUSD": "0"},
            "reserved": {"tokens": 0, "costUSD": "0"},
            "summary": {"concurrentRuns": "0", "runs": "0", "tokens": "0", "costUSD": "0.00"},
            "admitted": [],
            "reservations": [],
            "buckets": [],
            "lost": {"requests": 0, "tokens": 0, "costUSD": "0"},
            "refused": {"runs": 0, "requests": 0},
        }
    )


def test_the_summary_shows_only_the_usage_of_limits_the_quota_does_not_set() -> None:
    ledger = Ledger(definition(hard={"runs": 3}))
    ledger.admit("u1", "a", NOW)
    assert ledger.status(NOW, None)["summary"] == {
        "concurrentRuns": "1",
        "runs": "1/3",
        "tokens": "0",
        "costUSD": "0.00",
    }


def test_the_summary_shows_dollars_to_a_hundredth_of_a_cent_against_a_limit_below_a_dollar() -> None:
    ledger = Ledger(definition(hard={"costUSD": "0.05"}))
    ledger.reserve("u1", "a", "r1", "op/1", 0, Decimal("0.00439"), NOW)
    ledger.settle("u1", "r1", 0, Decimal("0.00439"), NOW)
    assert ledger.status(NOW, None)["summary"]["costUSD"] == "0.0044/0.05"


def test_a_month_status_starts_its_window_at_the_first_instant_of_the_month() -> None:
    assert _busy_ledger("Month").status(NOW, None)["windowStart"] == "2026-11-01T00:00:00Z"


def test_buckets_that_left_the_window_are_pruned_from_the_status_and_the_usage() -> None:
    ledger = _busy_ledger("Hour")
    later = at("2026-11-24T10:01:30Z")  # 08:59 and 09:00 buckets ended at 09:00 and 09:01
    status = ledger.status(later, None)
    assert [b["start"] for b in status["buckets"]] == ["2026-11-24T09:01:00Z", "2026-11-24T09:20:00Z"]
    assert status["used"]["runs"] == 1
    assert status["used"]["concurrentRuns"] == 2  # admissions last until the runs end


def test_a_status_read_back_gives_the_same_ledger_and_the_same_status() -> None:
    status = _busy_ledger().status(NOW, 3)
    reloaded = Ledger.load(definition(hard=HARD), copy.deepcopy(status), NOW)
    assert reloaded.status(NOW, 3) == status


def test_a_status_read_back_by_a_later_process_keeps_admissions_reservations_and_window_usage() -> None:
    status = _busy_ledger().status(NOW, 3)
    later = at("2026-11-24T09:40:00Z")
    reloaded = Ledger.load(definition(hard=HARD), status, later)
    assert reloaded.admit("u2", "second", later) == Admitted()
    assert reloaded.used(later).runs == 2
    reloaded.settle("u2", "r1", 100, Decimal("0.001"), later)
    assert reloaded.status(later, 3)["used"]["tokens"] == 17445


def test_no_status_is_an_empty_ledger() -> None:
    statuses: list[Any] = [None, {}, "garbage"]
    for status in statuses:
        ledger = Ledger.load(definition(hard=HARD), status, NOW)
        assert ledger.uids() == set()
        assert ledger.used(NOW).runs == 0


def _damaged(change: Any) -> Ledger:
    status = _busy_ledger().status(NOW, 3)
    change(status)
    return Ledger.load(definition(hard=HARD), status, NOW)


def test_window_usage_lost_from_the_buckets_is_booked_again_from_the_recorded_totals() -> None:
    ledger = _damaged(lambda status: status.pop("buckets"))
    status = ledger.status(NOW, 3)
    assert status["used"] == {"concurrentRuns": 2, "runs": 2, "tokens": 17345, "costUSD": "0.143456"}
    # booked in the newest bucket the previous write can have had: it expires late, never early
    assert status["buckets"] == [
        {"start": "2026-11-24T09:15:00Z", "runs": 2, "tokens": 17345, "costUSD": "0.143456"}
    ]


def test_a_bucket_with_an_unreadable_start_keeps_its_usage_in_the_newest_bucket() -> None:
    def change(status: dict[str, Any]) -> None:
        status["buckets"][0]["start"] = "yesterday-ish"

    assert _damaged(change).used(NOW).runs == 2


def test_an_unreadable_count_in_a_bucket_is_made_up_from_the_recorded_total() -> None:
    def change(status: dict[str, Any]) -> None:
        status["buckets"][1]["tokens"] = "many"
        status["buckets"][1]["costUSD"] = "NaN"

    ledger = _damaged(change)
    assert ledger.used(NOW).tokens == 17345
    assert ledger.used(NOW).cost_usd == Decimal("0.143456")


def test_unreadable_counts_with_unreadable_totals_are_taken_as_the_whole_limit() -> None:
    def change(status: dict[str, Any]) -> None:
        status["buckets"][1]["tokens"] = -4
        status["used"]["tokens"] = None

    ledger = _damaged(change)
    assert ledger.used(NOW).tokens == 2_000_000
    assert isinstance(ledger.admit("u3", "c", NOW), Blocked)


def test_admissions_without_a_uid_become_placeholders_the_reconciler_can_release() -> None:
    def change(status: dict[str, Any]) -> None:
        del status["admitted"][0]["uid"]

    ledger = _damaged(change)
    assert ledger.uids() == {"u2", "unaccounted-admission-0"}
    assert ledger.status(NOW, 3)["used"]["concurrentRuns"] == 2


def test_admissions_missing_from_the_list_still_count_against_concurrent_runs() -> None:
    ledger = _damaged(lambda status: status["admitted"].pop())
    assert ledger.status(NOW, 3)["used"]["concurrentRuns"] == 2
    assert "u1" in ledger.uids()


def test_an_unreadable_admission_list_with_no_total_fills_concurrent_runs() -> None:
    def change(status: dict[str, Any]) -> None:
        status["admitted"] = "u1,u2"
        del status["used"]

    ledger = _damaged(change)
    assert ledger.status(NOW, 3)["used"]["concurrentRuns"] == 5
    assert isinstance(ledger.admit("u3", "c", NOW), Blocked)


def test_an_unreadable_reservation_is_held_again_as_a_placeholder_charged_in_full_when_collected() -> None:
    def change(status: dict[str, Any]) -> None:
        status["reservations"][0]["tokens"] = "lots"

    ledger = _damaged(change)
    assert ledger.reserved().tokens == 8192
    placeholders = [uid for uid in ledger.uids() if uid.startswith("unaccounted")]
    assert placeholders == ["unaccounted"]
    assert ledger.charge_lost("unaccounted", keep_holder=None, now=NOW) == 1
    assert ledger.used(NOW).tokens == 17345 + 8192


def test_unreadable_totals_alone_lose_nothing_the_entries_hold() -> None:
    def change(status: dict[str, Any]) -> None:
        status["used"] = "?"
        status["reserved"] = {"tokens": "x", "costUSD": []}
        status["lost"] = None

    ledger = _damaged(change)
    status = ledger.status(NOW, 3)
    assert status["used"]["tokens"] == 17345
    assert status["reserved"] == {"tokens": 8192, "costUSD": "0.05"}
    assert status["lost"] == {"requests": 0, "tokens": 0, "costUSD": "0"}


def test_a_status_written_in_the_previous_month_counts_nothing_in_this_one() -> None:
    december = at("2026-12-31T23:59:00Z")
    ledger = Ledger(definition(window="Month", hard=HARD))
    ledger.admit("u1", "a", december)
    ledger.release("u1")
    status = ledger.status(december, 1)
    status.pop("buckets")  # even what the totals say belongs to December
    january = at("2027-01-01T00:00:00Z")
    reloaded = Ledger.load(definition(window="Month", hard=HARD), status, january)
    assert reloaded.used(january).runs == 0
    assert reloaded.used(december).runs == 1


def test_a_quota_object_is_read_with_its_defaults() -> None:
    quota = QuotaDefinition.from_object(
        quota_object(window=None, hard={"costUSD": 0.1, "tokens": 5}, per_run={"costBudgetUSD": {"max": 2.5}})
    )
    assert quota.window is Window.DAY
    assert quota.hard.cost_usd == Decimal("0.1")
    assert quota.hard.concurrent_runs is None
    assert quota.per_run["costBudgetUSD"].max == Decimal("2.5")
    assert quota.per_run["maxIterations"].max is None
    assert quota.label == "research/team"


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            quota_object(window="Week"),
            "AgentRunQuota research/team: spec.window 'Week' is not one of Hour, Day, Month",
        ),
        (
            quota_object(hard={"runs": -1}),
            "AgentRunQuota research/team: spec.hard.runs must be a whole number >= 0, got -1",
        ),
        (
            quota_object(hard={"costUSD": "lots"}),
            "AgentRunQuota research/team: spec.hard.costUSD must be a number of US dollars >= 0, got 'lots'",
        ),
        (
            quota_object(per_run={"maxIterations": {"max": 5, "default": 9}}),
            "AgentRunQuota research/team: spec.perRun.maxIterations: default 9 is above max 5",
        ),
        ({"spec": {}}, "an AgentRunQuota object needs metadata.namespace and metadata.name"),
    ],
)
def test_a_quota_the_ledger_cannot_count_against_is_refused_in_one_line(
    obj: dict[str, Any], message: str
) -> None:
    with pytest.raises(QuotaSpecError) as raised:
        QuotaDefinition.from_object(obj)
    assert str(raised.value) == message
