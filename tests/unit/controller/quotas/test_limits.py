"""A run's per-run limits between its object and the policy: what it declares, what is recorded and
applied. The policy itself (smallest default, capped maxima, first quota by name) is proved in
tests/unit/quotas/test_per_run.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, QuotaLimits
from agentrun.controller.quotas import limits
from agentrun.quotas.ledger import QuotaDefinition, SandboxUse


def definition(name: str, **per_run: Any) -> QuotaDefinition:
    return QuotaDefinition.from_object(
        {"metadata": {"namespace": "team", "name": name}, "spec": {"perRun": per_run}}
    )


def spec(**limits: Any) -> AgentRunSpec:
    return AgentRunSpec.model_validate({"task": "x", "limits": limits})


def test_what_a_run_declares_is_what_its_spec_sets_as_whole_numbers_and_exact_dollars() -> None:
    assert limits.declared(spec(tokenBudget=900, costBudgetUSD=0.1)) == {
        "tokenBudget": 900,
        "costBudgetUSD": Decimal("0.1"),
        "maxIterations": None,
        "timeoutSeconds": None,
    }
    assert set(limits.declared(AgentRunSpec(task="x")).values()) == {None}


def test_a_limit_declared_at_its_default_is_declared_and_one_left_out_is_not() -> None:
    assert limits.declared(spec(maxIterations=20))["maxIterations"] == 20
    assert limits.declared(spec(timeoutSeconds=60))["maxIterations"] is None


def test_what_the_quotas_impose_is_recorded_as_a_status_with_dollars_as_a_number() -> None:
    quotas = [
        definition("a", tokenBudget={"max": 90_000, "default": 80_000}),
        definition("b", tokenBudget={"default": 100_000, "max": 200_000}, maxIterations={"max": 50}),
        definition("c", tokenBudget={"max": 70_000}, costBudgetUSD={"max": 2.5}, timeoutSeconds={"max": 600}),
    ]
    assert limits.imposed(quotas, spec()) == QuotaLimits.model_validate(
        {"tokenBudget": 70_000, "costBudgetUSD": 2.5, "maxIterations": 20, "timeoutSeconds": 600}
    )


def test_limits_the_run_declares_itself_are_left_alone() -> None:
    quotas = [definition("a", tokenBudget={"max": 1000, "default": 500}, maxIterations={"default": 3})]
    imposed = limits.imposed(quotas, spec(tokenBudget=900))
    assert imposed == QuotaLimits(max_iterations=3)
    applied = limits.applied(spec(tokenBudget=900), imposed)
    assert (applied.limits.token_budget, applied.limits.max_iterations) == (900, 3)


def test_every_imposed_limit_is_applied_to_the_spec_the_loop_uses() -> None:
    imposed = QuotaLimits.model_validate(
        {"tokenBudget": 7, "costBudgetUSD": 0.5, "maxIterations": 4, "timeoutSeconds": 60}
    )
    applied = limits.applied(spec(), imposed)
    assert applied.limits.token_budget == 7
    assert applied.limits.cost_budget_usd == 0.5
    assert applied.limits.max_iterations == 4
    assert applied.limits.timeout_seconds == 60
    unchanged = AgentRunSpec.model_validate({"task": "x"})
    assert limits.applied(unchanged, None) is unchanged


def test_quotas_that_say_nothing_about_per_run_limits_impose_nothing() -> None:
    assert limits.imposed([definition("a")], spec()) is None


def test_a_declared_limit_above_a_max_names_the_first_quota_and_the_field() -> None:
    quotas = [definition("a", maxIterations={"max": 100}), definition("b", maxIterations={"max": 10})]
    refused = limits.violation(quotas, spec(maxIterations=30))
    assert refused is not None
    assert (refused.quota, refused.field) == ("b", "maxIterations")
    assert "team/b" in refused.message and "maxIterations" in refused.message and "10" in refused.message
    assert limits.violation(quotas, spec(maxIterations=10)) is None


def test_a_recorded_status_is_kept_and_an_empty_one_is_none() -> None:
    def recorded(status: dict[str, Any]) -> QuotaLimits | None:
        return limits.recorded(AgentRunStatus.model_validate(status))

    assert recorded({"quotaLimits": {"tokenBudget": 5}}) == QuotaLimits(token_budget=5)
    assert recorded({"quotaLimits": {}}) is None
    assert recorded({}) is None


def test_a_sandbox_counts_by_its_limits_not_its_requests_and_a_run_without_one_counts_none() -> None:
    resources = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1.5", "memory": "1Gi"}}
    boxed = AgentRunSpec.model_validate({"task": "x", "sandbox": {"image": "i", "resources": resources}})
    assert limits.sandbox_use(boxed) == SandboxUse(cpu=Decimal("1.5"), memory=Decimal(2**30))
    assert limits.sandbox_use(spec()) is None
