"""An Agent's verdict: the run's own admission on the Agent's spec, one line naming the fields."""

from __future__ import annotations

from typing import Any

from agentrun.controller.agents import validating
from agentrun.controller.agents.validating import check
from agentrun.controller.status_memory import status_patch

MODEL = {"name": "claude-haiku-4-5"}


def agent_status(agent: dict[str, Any], now: str) -> dict[str, Any]:
    """The Agent's status as its writer patches it."""
    return status_patch(validating.agent_status(agent, now))


def body(spec: dict[str, Any], generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "a", "generation": generation}, "spec": spec, "status": status or {}}


def test_an_agent_a_run_would_be_admitted_with_is_valid() -> None:
    assert check({"model": MODEL, "tools": [{"builtin": {"name": "calculator"}}]}) is None


def test_a_tool_config_the_tool_refuses_is_named_with_its_field() -> None:
    problem = check(
        {"model": MODEL, "tools": [{"builtin": {"name": "kubernetes_get", "config": {"bogus": 1}}}]}
    )
    assert problem is not None
    assert problem.startswith("spec.tools[0].builtin.config: kubernetes_get: unknown keys ['bogus']")


def test_a_malformed_secret_reference_of_an_http_tool_is_named() -> None:
    http = {"name": "lookup", "description": "Looks up.", "url": "http://x", "headersFrom": {"name": ""}}
    problem = check({"model": MODEL, "tools": [{"http": http}]})
    assert problem is not None and "spec.tools[0].http.headersFrom.name" in problem


def test_every_field_pydantic_refuses_is_named_in_one_line() -> None:
    problem = check({"model": {"name": ""}, "limits": {"maxIterations": 0}})
    assert problem is not None and "\n" not in problem
    assert "spec.model.name" in problem and "spec.limits.maxIterations" in problem


def test_a_cross_field_rule_the_crd_cannot_express_is_named() -> None:
    problem = check({"model": MODEL, "requiredTools": ["nope"]})
    assert problem == "spec.requiredTools: 'nope' is not one of the run's tools"


def test_the_status_of_a_valid_agent_is_ready_at_its_generation() -> None:
    status = agent_status(body({"model": MODEL}, generation=4), "2026-01-01T00:00:00Z")
    assert status == {
        "observedGeneration": 4,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Valid",
                "message": "runs of this Agent are admitted",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 4,
            }
        ],
    }


def test_an_invalid_agent_is_not_ready_with_reason_invalid_spec_and_the_fields() -> None:
    status = agent_status(body({"model": MODEL, "requiredTools": ["nope"]}), "2026-01-01T00:00:00Z")
    [ready] = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"] == "spec.requiredTools: 'nope' is not one of the run's tools"


def test_the_transition_time_moves_only_when_ready_changes() -> None:
    first = agent_status(body({"model": MODEL}), "2026-01-01T00:00:00Z")
    same = agent_status(body({"model": MODEL}, generation=2, status=first), "2026-01-02T00:00:00Z")
    assert same["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same["observedGeneration"] == 2
    flipped = agent_status(body({"model": MODEL, "requiredTools": ["x"]}, 3, same), "2026-01-03T00:00:00Z")
    assert flipped["conditions"][0]["lastTransitionTime"] == "2026-01-03T00:00:00Z"


def test_an_agent_offered_over_a2a_is_judged_on_its_runs_part_alone() -> None:
    """spec.a2a is about the Agent (its card): a run of it never carries the field, so it is no reason
    to refuse; the CRD's schema checks it when the Agent is applied."""
    assert (
        check(
            {
                "model": MODEL,
                "a2a": {"expose": True, "skills": [{"id": "s", "name": "S", "description": "d"}]},
            }
        )
        is None
    )
