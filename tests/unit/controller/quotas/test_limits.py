"""Per-run limits from the namespace's quotas: maxima refused with quota and field, defaults applied."""

from __future__ import annotations

from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import QuotaLimits
from agentrun.controller.quotas import limits
from agentrun.quotas.ledger import QuotaDefinition


def definition(name: str, **per_run: Any) -> QuotaDefinition:
    return QuotaDefinition.from_object(
        {"metadata": {"namespace": "team", "name": name}, "spec": {"perRun": per_run}}
    )


def test_the_smallest_default_wins_capped_at_the_smallest_max() -> None:
    quotas = [
        definition("a", tokenBudget={"max": 90_000, "default": 80_000}),
        definition("b", tokenBudget={"default": 100_000, "max": 200_000}, maxIterations={"max": 50}),
        definition("c", tokenBudget={"max": 70_000}),
    ]
    imposed = limits.imposed(quotas, {"task": "x"})
    assert imposed == QuotaLimits(token_budget=70_000, max_iterations=20)


def test_without_a_default_budgets_get_the_smallest_max_and_the_built_in_ones_are_capped() -> None:
    quotas = [definition("a", costBudgetUSD={"max": 2.5}, timeoutSeconds={"max": 600})]
    assert limits.imposed(quotas, {"task": "x"}) == QuotaLimits(cost_budget_usd=2.5, timeout_seconds=600)


def test_limits_the_run_declares_itself_are_left_alone() -> None:
    quotas = [definition("a", tokenBudget={"max": 1000, "default": 500}, maxIterations={"default": 3})]
    imposed = limits.imposed(quotas, {"task": "x", "limits": {"tokenBudget": 900}})
    assert imposed == QuotaLimits(max_iterations=3)
    spec = limits.applied(AgentRunSpec.model_validate({"task": "x", "limits": {"tokenBudget": 900}}), imposed)
    assert (spec.limits.token_budget, spec.limits.max_iterations) == (900, 3)


def test_quotas_that_say_nothing_about_per_run_limits_impose_nothing() -> None:
    assert limits.imposed([definition("a")], {"task": "x"}) is None


def test_a_declared_limit_above_a_max_names_the_first_quota_and_the_field() -> None:
    quotas = [definition("a", maxIterations={"max": 100}), definition("b", maxIterations={"max": 10})]
    refused = limits.violation(quotas, {"task": "x", "limits": {"maxIterations": 30}})
    assert refused is not None
    assert (refused.quota, refused.field) == ("b", "maxIterations")
    assert "team/b" in refused.message and "maxIterations" in refused.message and "10" in refused.message
    assert limits.violation(quotas, {"task": "x", "limits": {"maxIterations": 10}}) is None
