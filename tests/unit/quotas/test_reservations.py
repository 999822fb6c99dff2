"""Reservations: the most a request may cost is held before it is sent and settled after the answer."""

from __future__ import annotations

from decimal import Decimal

from agentrun.quotas.ledger import Blocked, Ledger, Reserved
from tests.unit.quotas.quota_objects import at, definition

NOW = at("2026-11-24T09:20:00Z")


def _spent(ledger: Ledger, uid: str, request_id: str, tokens: int, cost: Decimal | None = None) -> None:
    assert ledger.reserve(uid, "run", request_id, "op/1", tokens, cost, NOW) == Reserved()
    ledger.settle(uid, request_id, tokens, cost, NOW)


def test_a_request_that_fits_with_everything_in_flight_is_reserved_and_counted_as_reserved() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000, "costUSD": 1}))
    assert ledger.reserve("u1", "a", "r1", "op/1", 600, Decimal("0.25"), NOW) == Reserved()
    status = ledger.status(NOW, 2)
    assert status["reserved"] == {"tokens": 600, "costUSD": "0.25"}
    assert status["used"]["tokens"] == 0
    assert status["reservations"] == [
        {
            "uid": "u1",
            "name": "a",
            "id": "r1",
            "holder": "op/1",
            "tokens": 600,
            "costUSD": "0.25",
            "at": "2026-11-24T09:20:00Z",
        }
    ]


def test_a_request_filling_the_limit_exactly_is_reserved() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    _spent(ledger, "u1", "r1", 400)
    assert ledger.reserve("u1", "a", "r2", "op/1", 600, None, NOW) == Reserved()


def test_a_request_that_fits_only_once_others_settle_waits_without_changing_the_ledger() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    ledger.reserve("u1", "a", "r1", "op/1", 700, None, NOW)
    before = ledger.status(NOW, 1)
    blocked = ledger.reserve("u2", "b", "r1", "op/1", 400, None, NOW)
    assert blocked == Blocked(
        "tokens",
        "quota research/team: tokens limit 1000: this model request may use up to 400; 0 are used and 700 "
        "reserved by requests in flight; room expected when they settle",
        None,
        final=False,
    )
    assert ledger.status(NOW, 1) == before
    ledger.settle("u1", "r1", 500, None, NOW)
    assert ledger.reserve("u2", "b", "r1", "op/1", 400, None, NOW) == Reserved()


def test_a_request_that_does_not_fit_against_used_alone_is_refused_for_good_and_counted() -> None:
    ledger = Ledger(definition(window="Hour", hard={"tokens": 1000}))
    _spent(ledger, "u1", "r1", 800)
    blocked = ledger.reserve("u1", "a", "r2", "op/1", 300, None, NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.final
    assert blocked.limit == "tokens"
    assert blocked.room_at == at("2026-11-24T10:21:00Z")
    assert blocked.message == (
        "quota research/team: tokens limit 1000: this model request may use up to 300 but 800 are used in "
        "the rolling hour; room expected at 2026-11-24T10:21:00Z"
    )
    assert ledger.status(NOW, None)["refused"] == {"runs": 0, "requests": 1}


def test_a_request_larger_than_the_whole_limit_is_refused_with_no_room_to_expect() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    blocked = ledger.reserve("u1", "a", "r1", "op/1", 1001, None, NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.final
    assert blocked.room_at is None
    assert "more than the whole limit; room expected only when the quota is raised" in blocked.message


def test_a_request_over_the_dollar_limit_is_refused_naming_the_limit_even_when_its_tokens_fit() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000, "costUSD": "0.5"}))
    blocked = ledger.reserve("u1", "a", "r1", "op/1", 10, Decimal("0.51"), NOW)
    assert isinstance(blocked, Blocked)
    assert (blocked.limit, blocked.final) == ("costUSD", True)
    assert "costUSD limit 0.5: this model request may use up to 0.51" in blocked.message


def test_a_refusal_for_good_wins_over_a_wait_on_another_limit() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000, "costUSD": 1}))
    ledger.reserve("u1", "a", "r1", "op/1", 900, Decimal(0), NOW)  # tokens would have to wait
    _spent(ledger, "u2", "r1", 0, Decimal("0.9"))  # dollars are gone for good
    blocked = ledger.reserve("u3", "c", "r1", "op/1", 200, Decimal("0.2"), NOW)
    assert isinstance(blocked, Blocked)
    assert (blocked.limit, blocked.final) == ("costUSD", True)


def test_an_unpriced_model_under_a_dollar_limit_is_refused_naming_the_missing_price() -> None:
    ledger = Ledger(definition(hard={"costUSD": 5}))
    blocked = ledger.reserve("u1", "a", "r1", "op/1", 10, None, NOW)
    assert isinstance(blocked, Blocked)
    assert (blocked.limit, blocked.final) == ("costUSD", True)
    assert blocked.message == (
        "quota research/team: costUSD limit 5 cannot be kept for this model: it has no price in the "
        "operator's price table (add one with AGENTRUN_PRICE_FILE)"
    )


def test_an_unpriced_model_is_counted_in_tokens_where_no_dollar_limit_applies() -> None:
    ledger = Ledger(definition(hard={"tokens": 100}))
    assert ledger.reserve("u1", "a", "r1", "op/1", 10, None, NOW) == Reserved()
    ledger.settle("u1", "r1", 7, None, NOW)
    assert ledger.status(NOW, None)["used"] == {"concurrentRuns": 0, "runs": 0, "tokens": 7, "costUSD": "0"}


def test_reserving_the_same_request_again_holds_it_once() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    assert ledger.reserve("u1", "a", "r1", "op/1", 600, None, NOW) == Reserved()
    assert ledger.reserve("u1", "a", "r1", "op/1", 600, None, NOW) == Reserved()
    assert ledger.reserved().tokens == 600


def test_settling_books_the_real_usage_in_the_bucket_of_the_answer() -> None:
    ledger = Ledger(definition(window="Hour", hard={"tokens": 1000}))
    ledger.reserve("u1", "a", "r1", "op/1", 600, Decimal("0.06"), at("2026-11-24T09:20:59Z"))
    ledger.settle("u1", "r1", 321, Decimal("0.0321"), at("2026-11-24T09:21:00Z"))
    status = ledger.status(at("2026-11-24T09:21:00Z"), None)
    assert status["reserved"] == {"tokens": 0, "costUSD": "0"}
    assert status["reservations"] == []
    assert status["buckets"] == [
        {"start": "2026-11-24T09:21:00Z", "runs": 0, "tokens": 321, "costUSD": "0.0321"}
    ]


def test_settling_an_unknown_or_already_settled_request_changes_nothing() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    ledger.reserve("u1", "a", "r1", "op/1", 600, None, NOW)
    ledger.settle("u1", "r1", 100, None, NOW)
    before = ledger.status(NOW, None)
    ledger.settle("u1", "r1", 100, None, NOW)
    ledger.settle("u1", "never", 100, None, NOW)
    ledger.settle("someone", "r1", 100, None, NOW)
    assert ledger.status(NOW, None) == before


def test_a_request_settled_without_a_known_price_is_charged_the_dollars_it_reserved() -> None:
    ledger = Ledger(definition(hard={"costUSD": 1}))
    ledger.reserve("u1", "a", "r1", "op/1", 600, Decimal("0.4"), NOW)
    ledger.settle("u1", "r1", 600, None, NOW)
    assert ledger.used(NOW).cost_usd == Decimal("0.4")


def test_a_request_undone_by_settling_to_zero_leaves_no_trace_in_the_window() -> None:
    ledger = Ledger(definition(hard={"tokens": 1000}))
    ledger.reserve("u1", "a", "r1", "op/1", 600, Decimal("0.1"), NOW)
    ledger.settle("u1", "r1", 0, Decimal(0), NOW)
    status = ledger.status(NOW, None)
    assert status["buckets"] == []
    assert status["used"]["tokens"] == 0


def test_reservations_of_a_stopped_holder_are_charged_in_full_and_counted_as_lost() -> None:
    ledger = Ledger(definition(hard={"tokens": 10_000, "costUSD": 10}))
    ledger.reserve("u1", "a", "r1", "op-a/1", 600, Decimal("0.1"), NOW)
    ledger.reserve("u1", "a", "r2", "op-a/1", 400, Decimal("0.2"), NOW)
    ledger.reserve("u1", "a", "r3", "op-b/2", 50, Decimal("0.05"), NOW)
    ledger.reserve("u2", "b", "r1", "op-a/1", 70, Decimal("0.07"), NOW)
    assert ledger.charge_lost("u1", keep_holder="op-b/2", now=NOW) == 2
    status = ledger.status(NOW, None)
    assert status["lost"] == {"requests": 2, "tokens": 1000, "costUSD": "0.3"}
    assert status["used"]["tokens"] == 1000
    assert status["used"]["costUSD"] == "0.3"
    assert [(r["uid"], r["id"]) for r in status["reservations"]] == [("u1", "r3"), ("u2", "r1")]
    assert ledger.charge_lost("u1", keep_holder="op-b/2", now=NOW) == 0


def test_collecting_a_gone_run_charges_every_reservation_it_held() -> None:
    ledger = Ledger(definition(hard={"tokens": 10_000}))
    ledger.admit("u1", "a", NOW)
    ledger.reserve("u1", "a", "r1", "op-a/1", 600, None, NOW)
    ledger.reserve("u1", "a", "r2", "op-b/1", 400, None, NOW)
    assert ledger.uids() == {"u1"}
    ledger.release("u1")
    assert ledger.charge_lost("u1", keep_holder=None, now=NOW) == 2
    assert ledger.uids() == set()
    assert ledger.used(NOW).tokens == 1000


def test_dollars_add_up_exactly_in_decimal() -> None:
    ledger = Ledger(definition(hard={"costUSD": "0.3"}))
    _spent(ledger, "u1", "r1", 1, Decimal("0.1"))
    _spent(ledger, "u1", "r2", 1, Decimal("0.2"))
    assert ledger.used(NOW).cost_usd == Decimal("0.3")
    assert ledger.status(NOW, None)["used"]["costUSD"] == "0.3"
    blocked = ledger.reserve("u1", "a", "r3", "op/1", 1, Decimal("0.000001"), NOW)
    assert isinstance(blocked, Blocked)
    assert blocked.final
    assert ledger.reserve("u1", "a", "r3", "op/1", 1, Decimal(0), NOW) == Reserved()


def test_a_tiny_price_adds_up_over_a_thousand_requests_without_drift() -> None:
    ledger = Ledger(definition(hard={}))
    for index in range(1000):
        _spent(ledger, "u1", f"r{index}", 1, Decimal("0.000003"))
    assert ledger.status(NOW, None)["used"]["costUSD"] == "0.003"
