"""The agent tool's own decisions: the child's name, its limits, and how its outcome reads."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from agentrun.api import status_patches
from agentrun.api.usage import TokenUsage
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import CallBudget
from agentrun.tools.agent_calling import ChildResult, answer, carve, child_name, tool_use_label


def test_a_childs_name_depends_only_on_the_parent_uid_and_the_tool_use_id() -> None:
    first = child_name("p" * 60, "uid-1", "toolu_A")
    assert first == child_name("p" * 60, "uid-1", "toolu_A")
    assert first != child_name("p" * 60, "uid-1", "toolu_B")
    assert first != child_name("p" * 60, "uid-2", "toolu_A")
    assert first.startswith("p" * 40 + "-") and len(first) == 51


def test_a_tool_use_id_that_is_no_label_value_is_hashed() -> None:
    assert tool_use_label("toolu_01ABC") == "toolu_01ABC"
    hashed = tool_use_label("text-3/../" + "x" * 80)
    assert len(hashed) == 40 and hashed.isalnum()


def test_each_sibling_gets_its_share_never_more_than_the_agent_allows() -> None:
    budget = CallBudget(tokens=9000, cost_usd=Decimal("1.00"), seconds=600.9, siblings=3)
    assert carve({"tokenBudget": 2000, "timeoutSeconds": 900}, budget) == {
        "tokenBudget": 2000,
        "costBudgetUSD": 0.333333,
        "timeoutSeconds": 200,
    }


def test_an_unlimited_parent_passes_the_agents_own_limits_on() -> None:
    carved = carve({"tokenBudget": 5000, "costBudgetUSD": 0.5}, CallBudget(siblings=2))
    assert carved == {"tokenBudget": 5000, "costBudgetUSD": 0.5, "timeoutSeconds": 1800}


@pytest.mark.parametrize(
    "budget",
    [
        CallBudget(tokens=0),
        CallBudget(cost_usd=Decimal("0.0000001")),
        CallBudget(seconds=1.5, siblings=2),
    ],
)
def test_a_parent_with_nothing_left_starts_no_child(budget: CallBudget) -> None:
    with pytest.raises(ToolError) as caught:
        carve({}, budget)
    assert caught.value.code == "budget_exhausted"


def test_a_failed_child_is_a_structured_error_naming_its_stop_reason() -> None:
    child = ChildResult(
        "parent-abc",
        "Failed",
        "MaxIterations",
        "maxIterations=3 reached",
        None,
        usage_by_model={"m": TokenUsage(input_tokens=5)},
    )
    output = answer(child)
    assert output.is_error and output.usage_by_model == {"m": TokenUsage(input_tokens=5)}
    assert json.loads(output.content) == {
        "code": "child_failed",
        "child": "parent-abc",
        "stopReason": "MaxIterations",
        "message": "maxIterations=3 reached",
    }


def test_a_childs_structured_output_is_the_result_as_json() -> None:
    child = ChildResult("c", "Succeeded", "EndTurn", None, "text", output={"n": 3}, has_output=True)
    assert json.loads(answer(child).content) == {"n": 3}
    assert answer(ChildResult("c", "Succeeded", "EndTurn", None, "the text")).content == "the text"


def test_the_children_summary_counts_phases_spend_and_approvals_awaited_below() -> None:
    def child(name: str, phase: str, tokens: int, cost: str | None, **status: object) -> dict[str, object]:
        usage = {"totalTokens": tokens, "costUSD": cost}
        return {"metadata": {"name": name}, "status": {"phase": phase, "usage": usage, **status}}

    bodies = [
        child("a", "Succeeded", 100, "0.001000"),
        child("b", "Failed", 50, "0.000500"),
        child(
            "c",
            "AwaitingApproval",
            10,
            "0.000100",
            pendingApprovals=[{"toolUseId": "toolu_9", "toolName": "deploy"}],
            children={"awaitingApproval": [{"run": "c-deep", "toolUseId": "toolu_7", "tool": "rm"}]},
        ),
    ]
    summary = status_patches.children(bodies).body()["children"]
    assert summary == {
        "total": 3,
        "active": 1,
        "succeeded": 1,
        "failed": 1,
        "tokens": 160,
        "costUSD": "0.001600",
        "awaitingApproval": [
            {"run": "c", "toolUseId": "toolu_9", "tool": "deploy"},
            {"run": "c-deep", "toolUseId": "toolu_7", "tool": "rm"},
        ],
    }
