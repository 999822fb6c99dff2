"""spec.model.thinking: combinations the Messages API refuses end the run InvalidSpec at admission,
in one line naming the fields, and the CRD carries the same rules for the API server."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api.crd import spec_schema
from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import StopReason
from agentrun.controller.agentruns import phases
from agentrun.loop.config import LoopConfig
from agentrun.loop.protocols import Thinking

TOOLS = [{"builtin": {"name": "current_time"}}]


def _admit(model: dict[str, Any], **spec: Any) -> AgentRunSpec | phases.Ending:
    return phases.read_spec({"task": "t", "model": model, **spec})


@pytest.mark.parametrize(
    ("model", "spec", "words"),
    [
        ({"thinking": {"budgetTokens": 512}}, {}, ["spec.model.thinking.budgetTokens", "1024"]),
        ({"thinking": {"budgetTokens": 4096}}, {}, ["budgetTokens (4096)", "maxTokens (4096)"]),
        ({"maxTokens": 2000, "thinking": {"budgetTokens": 3000}}, {}, ["less than model.maxTokens (2000)"]),
        ({"maxTokens": 8192, "thinking": {"budgetTokens": 2048}, "temperature": 0.2}, {}, ["temperature"]),
        (
            {"maxTokens": 8192, "thinking": {"budgetTokens": 2048}},
            {"tools": TOOLS, "toolChoice": {"type": "any"}},
            ["toolChoice.type any", "use auto or none"],
        ),
        (
            {"maxTokens": 8192, "thinking": {"budgetTokens": 2048}},
            {"tools": TOOLS, "toolChoice": {"type": "tool", "name": "current_time"}},
            ["toolChoice.type tool"],
        ),
    ],
    ids=["budget-too-small", "budget-equals-default-max", "budget-over-max", "temperature", "any", "tool"],
)
def test_an_impossible_thinking_combination_ends_the_run_invalid_spec_in_one_line(
    model: dict[str, Any], spec: dict[str, Any], words: list[str]
) -> None:
    ending = _admit(model, **spec)
    assert isinstance(ending, phases.Ending)
    assert ending.outcome.stop_reason is StopReason.INVALID_SPEC
    assert "\n" not in ending.outcome.message
    for word in words:
        assert word in ending.outcome.message


@pytest.mark.parametrize(
    ("model", "spec"),
    [
        ({"thinking": {"budgetTokens": 1024}}, {}),
        ({"maxTokens": 8192, "thinking": {"budgetTokens": 8191}, "temperature": 1}, {}),
        (
            {"maxTokens": 8192, "thinking": {"budgetTokens": 2048}},
            {"tools": TOOLS, "toolChoice": {"type": "none"}},
        ),
        ({"temperature": 0.2}, {"tools": TOOLS, "toolChoice": {"type": "any"}}),
    ],
    ids=["smallest-budget", "largest-budget-and-temperature-one", "tool-choice-none", "no-thinking"],
)
def test_possible_combinations_are_admitted(model: dict[str, Any], spec: dict[str, Any]) -> None:
    assert isinstance(_admit(model, **spec), AgentRunSpec)


def test_the_loop_gets_the_budget_and_interleaving_from_the_spec() -> None:
    spec = AgentRunSpec.model_validate(
        {"task": "t", "model": {"maxTokens": 8192, "thinking": {"budgetTokens": 2048, "interleaved": False}}}
    )
    assert LoopConfig.from_spec(spec, run_id="r").thinking == Thinking(2048, interleaved=False)
    plain = AgentRunSpec.model_validate({"task": "t"})
    assert LoopConfig.from_spec(plain, run_id="r").thinking is None


def test_the_crd_states_the_same_rules_for_the_api_server() -> None:
    schema = spec_schema()
    model_rules = {
        r.get("fieldPath"): r["rule"] for r in schema["properties"]["model"]["x-kubernetes-validations"]
    }
    assert (
        "self.thinking.budgetTokens < (has(self.maxTokens) ? self.maxTokens : 4096)"
        in model_rules[".thinking.budgetTokens"]
    )
    assert "self.temperature == 1.0" in model_rules[".temperature"]
    spec_rules = {r.get("fieldPath"): r["rule"] for r in schema["x-kubernetes-validations"]}
    assert (
        "self.toolChoice.type == 'auto' || self.toolChoice.type == 'none'" in spec_rules[".toolChoice.type"]
    )
    thinking = schema["properties"]["model"]["properties"]["thinking"]
    assert thinking["properties"]["budgetTokens"]["minimum"] == 1024
    assert "default" not in thinking  # off unless asked for
