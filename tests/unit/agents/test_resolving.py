"""The effective spec of a run from an Agent: merge rules, and limits that only tighten."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from agentrun.agents import AGENT_OWNED_FIELDS, AgentSpecConflict, resolving
from agentrun.api.agent import AGENT_ONLY_FIELDS, AgentSpec
from agentrun.api.spec import AgentRunSpec, Limits, LoopDetection

AGENT: dict[str, Any] = {
    "systemPrompt": "You review pull requests.",
    "model": {"name": "claude-sonnet-4-6", "maxTokens": 2048, "temperature": 0.2},
    "tools": [{"builtin": {"name": "calculator"}}],
    "requiredTools": ["calculator"],
    "limits": {"maxIterations": 10, "tokenBudget": 50_000, "loopDetection": {"repeats": 4}},
    "priority": 5,
}


def run(**fields: Any) -> dict[str, Any]:
    return {"task": "review #12", "agentRef": {"name": "reviewer"}, **fields}


def resolve(agent: dict[str, Any], run: dict[str, Any], name: str) -> dict[str, Any]:
    """The effective spec of the two manifests' specs, as what it declares (camelCase)."""
    effective = resolving.resolve(AgentSpec.model_validate(agent), AgentRunSpec.model_validate(run), name)
    return effective.model_dump(by_alias=True, exclude_unset=True)


def test_a_run_that_sets_nothing_gets_the_agents_spec_with_its_task_and_without_agent_ref() -> None:
    effective = resolve(AGENT, run(), "reviewer")
    assert effective == {**AGENT, "task": "review #12"}
    spec = AgentRunSpec.model_validate(effective)
    assert spec.system_prompt == "You review pull requests." and spec.agent_ref is None


def test_model_is_overridden_per_key_and_the_agent_is_left_unchanged() -> None:
    before = repr(AGENT)
    effective = resolve(AGENT, run(model={"maxTokens": 512}), "reviewer")
    assert effective["model"] == {"name": "claude-sonnet-4-6", "maxTokens": 512, "temperature": 0.2}
    assert repr(AGENT) == before


def test_limits_merge_per_key_including_loop_detection() -> None:
    limits = {"maxIterations": 5, "loopDetection": {"failuresPerTool": 3}}
    effective = resolve(AGENT, run(limits=limits), "reviewer")
    assert effective["limits"] == {
        "maxIterations": 5,
        "tokenBudget": 50_000,
        "loopDetection": {"repeats": 4, "failuresPerTool": 3},
    }


def test_other_fields_the_run_sets_replace_the_agents() -> None:
    effective = resolve(AGENT, run(priority=-3, ttlSecondsAfterFinished=60), "reviewer")
    assert (effective["priority"], effective["ttlSecondsAfterFinished"]) == (-3, 60)


@pytest.mark.parametrize("field", AGENT_OWNED_FIELDS)
def test_a_field_the_agent_owns_is_refused_by_resolution_and_by_the_model(field: str) -> None:
    sandbox = {"image": "i", "resources": {k: {"cpu": "1", "memory": "1Gi"} for k in ("requests", "limits")}}
    value: Any = {"systemPrompt": "x", "serviceAccountName": "sa", "sandbox": sandbox}.get(
        field, [] if "ools" in field else {}
    )
    without_ref = {k: v for k, v in run(**{field: value}).items() if k != "agentRef"}
    with pytest.raises(AgentSpecConflict, match=rf"^spec\.{field} comes from the Agent"):
        resolve(AGENT, without_ref, "reviewer")
    with pytest.raises(
        pydantic.ValidationError, match=rf"spec\.{field} comes from the Agent \(spec\.agentRef\)"
    ):
        AgentRunSpec.model_validate(run(**{field: value}))


def _numeric_limits() -> list[tuple[str, ...]]:
    top = [
        (name,)
        for name, info in Limits.model_fields.items()
        if info.annotation in (int, float, int | None, float | None)
    ]
    nested = [
        ("loop_detection", name)
        for name, info in LoopDetection.model_fields.items()
        if info.annotation is int
    ]
    return top + nested


def _alias(model: type[pydantic.BaseModel], name: str) -> str:
    info = model.model_fields[name]
    return info.alias or pydantic.alias_generators.to_camel(name)


def _inside(model: type[pydantic.BaseModel], name: str, wanted: int) -> int:
    """``wanted``, moved inside the field's bounds so that one less and one more are valid too."""
    low, high = -(10**9), 10**9
    for bound in model.model_fields[name].metadata:
        low = max(low, getattr(bound, "ge", low))
        high = min(high, getattr(bound, "le", high))
    return max(low + 1, min(high - 1, wanted))


def test_every_numeric_limit_is_covered() -> None:
    names = {path[-1] for path in _numeric_limits()}
    assert {"max_iterations", "token_budget", "cost_budget_usd", "timeout_seconds", "repeats"} <= names
    assert len(names) == 11


@pytest.mark.parametrize("path", _numeric_limits(), ids=lambda p: ".".join(p))
def test_every_numeric_limit_may_only_be_tightened(path: tuple[str, ...]) -> None:
    if len(path) == 1:
        key = _alias(Limits, path[0])
        agent_value = _inside(Limits, path[0], 100)
        agent = {"limits": {key: agent_value}}

        def limits(value: Any) -> dict[str, Any]:
            return {key: value}

        field = f"spec.limits.{key}"
    else:
        key = _alias(LoopDetection, path[1])
        agent_value = _inside(LoopDetection, path[1], 10)
        agent = {"limits": {"loopDetection": {key: agent_value}}}

        def limits(value: Any) -> dict[str, Any]:
            return {"loopDetection": {key: value}}

        field = f"spec.limits.loopDetection.{key}"
    assert resolve(agent, run(limits=limits(agent_value)), "a1")  # equal is allowed
    assert resolve(agent, run(limits=limits(agent_value - 1)), "a1")
    with pytest.raises(AgentSpecConflict) as refused:
        resolve(agent, run(limits=limits(agent_value + 1)), "a1")
    message = str(refused.value)
    assert message.startswith(f"{field} {agent_value + 1} is above the Agent a1's {agent_value};")
    assert "\n" not in message


def test_a_limit_the_agent_leaves_out_is_its_built_in_default() -> None:
    with pytest.raises(AgentSpecConflict, match=r"spec\.limits\.maxIterations 21 is above the Agent a1's 20"):
        resolve({}, run(limits={"maxIterations": 21}), "a1")
    assert resolve({}, run(limits={"maxIterations": 20}), "a1")["limits"] == {"maxIterations": 20}


def test_a_budget_the_agent_leaves_unlimited_may_be_set_to_anything() -> None:
    assert resolve({}, run(limits={"tokenBudget": 10**9}), "a1")["limits"] == {"tokenBudget": 10**9}


def test_removing_a_budget_the_agent_sets_is_loosening() -> None:
    with pytest.raises(AgentSpecConflict, match=r"spec\.limits\.tokenBudget null \(no limit\) is above"):
        resolve(AGENT, run(limits={"tokenBudget": None}), "reviewer")


def test_loop_detection_cannot_be_switched_off_but_may_be_switched_on() -> None:
    with pytest.raises(AgentSpecConflict, match=r"spec\.limits\.loopDetection\.enabled false .*Agent a1"):
        resolve({}, run(limits={"loopDetection": {"enabled": False}}), "a1")
    off = {"limits": {"loopDetection": {"enabled": False}}}
    assert resolve(off, run(limits={"loopDetection": {"enabled": True}}), "a1")["limits"][
        "loopDetection"
    ] == {"enabled": True}
    assert resolve(off, run(limits={"loopDetection": {"enabled": False}}), "a1")


def test_the_agent_spec_model_has_every_run_field_but_task_cancel_approvals_and_agent_ref() -> None:
    """Plus the fields about the Agent itself (its A2A card), which no run carries."""
    run_fields = set(AgentRunSpec.model_fields) - {"task", "cancel", "approvals", "agent_ref"}
    assert set(AgentSpec.model_fields) == run_fields | set(AGENT_ONLY_FIELDS)
    with pytest.raises(pydantic.ValidationError, match="task"):
        AgentSpec.model_validate({"task": "x"})


ON_BEDROCK: dict[str, Any] = {
    **AGENT,
    "model": {
        "provider": "bedrock",
        "name": "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        "bedrock": {"region": "eu-west-1", "credentialsSecretRef": {"name": "aws"}},
    },
}


def test_an_agents_provider_and_its_settings_carry_into_a_run_that_overrides_other_model_keys() -> None:
    effective = resolve(ON_BEDROCK, run(model={"maxTokens": 512}), "reviewer")
    assert effective["model"] == {**ON_BEDROCK["model"], "maxTokens": 512}


def test_a_run_switching_an_agents_provider_without_its_settings_is_refused_naming_them() -> None:
    with pytest.raises(
        pydantic.ValidationError, match=r"model\.bedrock is read only with model\.provider: bedrock"
    ):
        resolve(
            ON_BEDROCK, run(model={"provider": "vertex", "name": "claude-sonnet-4-5@20250929"}), "reviewer"
        )


def test_an_agent_on_vertex_may_not_compact_on_the_server() -> None:
    agent = {**AGENT, "model": {"provider": "vertex"}, "context": {"compaction": {"strategy": "Server"}}}
    with pytest.raises(pydantic.ValidationError, match="strategy Server needs Anthropic's API"):
        AgentSpec.model_validate(agent)


def test_an_agents_a2a_card_is_about_the_agent_and_never_part_of_its_runs() -> None:
    exposed = {"a2a": {"expose": True, "description": "reviews releases"}, "systemPrompt": "p"}
    resolved = resolve(exposed, run(), "a1")
    assert "a2a" not in resolved and resolved["systemPrompt"] == "p"
