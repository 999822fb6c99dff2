"""Per-run limits: maxima a run may not pass, and defaults for what it leaves out, over several quotas.

The one policy (agentrun.quotas.per_run); controller/quotas/test_limits.py covers how the controller
reads a run's declared limits and writes what is imposed.
"""

from __future__ import annotations

from decimal import Decimal

from agentrun.quotas.per_run import PerRunViolation, effective_limits, imposed_limits, per_run_violation
from tests.unit.quotas.quota_objects import definition

SMALL = definition(
    name="small",
    per_run={"tokenBudget": {"max": 200_000, "default": 100_000}, "costBudgetUSD": {"max": 5, "default": 2}},
)
CAPS = definition(name="caps", per_run={"maxIterations": {"max": 10}, "costBudgetUSD": {"max": 3}})
LOOSE = definition(
    name="loose", per_run={"tokenBudget": {"default": 50_000}, "timeoutSeconds": {"max": 7200}}
)


def test_a_limit_above_a_quota_maximum_is_named_with_the_quota_and_the_field() -> None:
    assert per_run_violation([SMALL], {"tokenBudget": 300_000}) == PerRunViolation(
        "small",
        "tokenBudget",
        "quota research/small: spec.limits.tokenBudget 300000 is above perRun.tokenBudget.max 200000",
    )


def test_limits_at_or_below_every_maximum_and_limits_left_out_pass() -> None:
    assert per_run_violation([SMALL], {"tokenBudget": 200_000, "costBudgetUSD": Decimal(5)}) is None
    assert per_run_violation([SMALL], {"tokenBudget": None}) is None
    assert per_run_violation([], {"tokenBudget": 10**12}) is None


def test_dollar_limits_compare_exactly_also_when_the_spec_gives_a_float() -> None:
    refused = per_run_violation([SMALL], {"costBudgetUSD": 5.01})
    assert refused is not None and refused.message == (
        "quota research/small: spec.limits.costBudgetUSD 5.01 is above perRun.costBudgetUSD.max 5"
    )
    assert per_run_violation([SMALL], {"costBudgetUSD": Decimal("5.000")}) is None


def test_of_several_quotas_the_first_by_name_that_refuses_is_named_at_its_first_field_passed() -> None:
    problem = per_run_violation([SMALL, CAPS], {"costBudgetUSD": Decimal(4), "maxIterations": 11})
    assert problem == PerRunViolation(
        "caps",
        "costBudgetUSD",
        "quota research/caps: spec.limits.costBudgetUSD 4 is above perRun.costBudgetUSD.max 3",
    )


def test_a_quota_whose_maximum_the_run_keeps_is_passed_over_for_the_one_it_does_not() -> None:
    wide = definition(name="a", per_run={"maxIterations": {"max": 100}})
    narrow = definition(name="b", per_run={"maxIterations": {"max": 10}})
    refused = per_run_violation([narrow, wide], {"maxIterations": 30})
    assert refused is not None and (refused.quota, refused.field) == ("b", "maxIterations")
    assert per_run_violation([narrow, wide], {"maxIterations": 10}) is None


def test_when_several_quotas_refuse_the_first_by_name_is_named_whatever_their_order() -> None:
    second = definition(name="b", per_run={"tokenBudget": {"max": 10}})
    first = definition(name="a", per_run={"tokenBudget": {"max": 20}})
    refused = per_run_violation([second, first], {"tokenBudget": 30})
    assert refused is not None and refused.quota == "a"


def test_what_a_run_declares_is_kept_as_declared() -> None:
    declared: dict[str, int | Decimal | None] = {
        "tokenBudget": 1234,
        "costBudgetUSD": Decimal("0.5"),
        "maxIterations": 3,
        "timeoutSeconds": 60,
    }
    assert effective_limits([SMALL, CAPS, LOOSE], declared) == declared


def test_a_limit_left_out_gets_the_smallest_default_of_the_quotas() -> None:
    assert effective_limits([SMALL, LOOSE], {})["tokenBudget"] == 50_000


def test_the_smallest_default_wins_capped_at_the_smallest_maximum_of_all_quotas() -> None:
    quotas = [
        definition(name="a", per_run={"tokenBudget": {"max": 90_000, "default": 80_000}}),
        definition(name="b", per_run={"tokenBudget": {"default": 100_000, "max": 200_000}}),
        definition(name="c", per_run={"tokenBudget": {"max": 70_000}}),
    ]
    assert effective_limits(quotas, {})["tokenBudget"] == 70_000
    assert effective_limits(quotas[:2], {})["tokenBudget"] == 80_000


def test_a_default_is_capped_at_the_smallest_maximum_of_another_quota() -> None:
    assert effective_limits([SMALL, CAPS], {})["costBudgetUSD"] == Decimal(2)
    tight = definition(name="tight", per_run={"costBudgetUSD": {"max": "1.5"}})
    assert effective_limits([SMALL, tight], {})["costBudgetUSD"] == Decimal("1.5")


def test_without_a_default_the_built_in_default_is_capped_at_the_smallest_maximum() -> None:
    limits = effective_limits([CAPS, LOOSE], {})
    assert limits["maxIterations"] == 10  # built-in 20, capped
    assert limits["timeoutSeconds"] == 1800  # built-in 1800, under the max 7200


def test_budgets_without_a_default_get_the_smallest_maximum_and_stay_unlimited_without_one() -> None:
    assert effective_limits([CAPS], {})["costBudgetUSD"] == Decimal(3)
    assert effective_limits([CAPS], {})["tokenBudget"] is None
    assert effective_limits([], {}) == {
        "tokenBudget": None,
        "costBudgetUSD": None,
        "maxIterations": 20,
        "timeoutSeconds": 1800,
    }


def test_only_limits_a_quota_set_for_what_the_run_left_out_are_recorded_as_imposed() -> None:
    assert imposed_limits([CAPS, LOOSE], {"maxIterations": 4}) == {
        "tokenBudget": 50_000,
        "costBudgetUSD": Decimal(3),
        "timeoutSeconds": 1800,
    }
    assert imposed_limits([], {}) == {}


def test_quotas_that_say_nothing_about_per_run_limits_impose_nothing() -> None:
    assert imposed_limits([definition(name="silent", hard={"tokens": 10})], {}) == {}


def test_a_built_in_default_is_imposed_only_where_a_quota_caps_the_field() -> None:
    capped = definition(name="capped", per_run={"maxIterations": {"max": 50}})
    assert imposed_limits([capped], {}) == {"maxIterations": 20}
    assert imposed_limits([capped], {"maxIterations": 40}) == {}
