"""Tools that spawn runs of their own (the agent tool kind): shared budgets, adopted usage, no timeout."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from prometheus_client import CollectorRegistry

from agentrun.api.stops import StopReason
from agentrun.api.usage import TokenUsage
from agentrun.loop.events import Checkpoint, UsageAdopted
from agentrun.loop.protocols import CallBudget, ToolCall, ToolDefinition, ToolOutput
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun_sandbox.messages.script import Reply, ScriptUsage, text_block, tool_use_block
from tests.support.loop_harness import FakeTool, run_scripted


@dataclass
class SpawningTool:
    """Stands for the agent tool: answers with a child's result and the child's usage."""

    name: str
    usage: Mapping[str, TokenUsage] = field(default_factory=dict)
    delay: float = 0.0
    timeout_seconds: float | None = math.inf
    calls: list[ToolCall] = field(default_factory=list)

    @property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            self.name,
            "a sub-agent",
            {"type": "object"},
            spawns_runs=True,
            timeout_seconds=self.timeout_seconds,
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        self.calls.append(call)
        if self.delay:
            await asyncio.sleep(self.delay)
        return ToolOutput(f"child of {call.id} done", usage_by_model=self.usage)


def _answer() -> Reply:
    return Reply([text_block("all done")], usage=ScriptUsage(10, 5))


async def test_calls_that_spawn_runs_share_what_the_run_has_left_of_its_budgets() -> None:
    spawn = SpawningTool("research")
    plain = FakeTool("lookup")
    turn = Reply(
        [
            tool_use_block("research", {"task": "a"}, id="toolu_1"),
            tool_use_block("research", {"task": "b"}, id="toolu_2"),
            tool_use_block("lookup", {}, id="toolu_3"),
        ],
        usage=ScriptUsage(100, 20),
    )
    run = await run_scripted(
        [turn, _answer()],
        tools=[spawn, plain],
        spec={
            "model": {"name": "claude-sonnet-4-6"},
            "limits": {"tokenBudget": 1000, "costBudgetUSD": 1, "timeoutSeconds": 600},
        },
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    budgets = [c.budget for c in spawn.calls]
    assert [b.siblings for b in budgets] == [2, 2]
    assert {b.tokens for b in budgets} == {880}
    # 100 input at $3/M + 20 output at $15/M = $0.0006 spent of $1.
    assert {b.cost_usd for b in budgets} == {Decimal("0.9994")}
    assert all(b.seconds is not None and 0 < b.seconds <= 600 for b in budgets)
    assert plain.calls[0].budget.siblings == 2


async def test_a_turn_without_a_spawning_call_is_not_priced_for_its_calls() -> None:
    """Only a call that starts a child run reads its budget; other turns leave it at the default."""
    plain = FakeTool("lookup")
    run = await run_scripted(
        [Reply([tool_use_block("lookup", {}, id="toolu_1")], usage=ScriptUsage(100, 20)), _answer()],
        tools=[plain],
        spec={"model": {"name": "claude-sonnet-4-6"}, "limits": {"tokenBudget": 1000, "costBudgetUSD": 1}},
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert plain.calls[0].budget == CallBudget()


async def test_a_run_without_budgets_hands_its_calls_unlimited_tokens_and_dollars() -> None:
    spawn = SpawningTool("research")
    run = await run_scripted(
        [Reply([tool_use_block("research", {}, id="toolu_1")]), _answer()], tools=[spawn]
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    budget = spawn.calls[0].budget
    assert (budget.tokens, budget.cost_usd, budget.siblings) == (None, None, 1)


async def test_usage_a_call_spent_elsewhere_is_the_runs_own_in_its_checkpoint_and_totals() -> None:
    child = TokenUsage(input_tokens=300, output_tokens=40)
    spawn = SpawningTool("research", usage={"claude-haiku-4-5": child})
    run = await run_scripted(
        [Reply([tool_use_block("research", {}, id="toolu_1")], usage=ScriptUsage(100, 20)), _answer()],
        tools=[spawn],
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.finished.progress.usage.total == 100 + 20 + 10 + 5 + 340
    results_checkpoint = [c for c in run.recorder.of(Checkpoint) if not c.tools_pending][-2]
    assert results_checkpoint.state["usageByModel"]["claude-haiku-4-5"] == child.as_dict()
    adopted = run.recorder.of(UsageAdopted)
    assert len(adopted) == 1 and adopted[0].usage_by_model == {"claude-haiku-4-5": child}


async def test_a_childs_usage_counts_against_the_parents_token_budget() -> None:
    spawn = SpawningTool("research", usage={"claude-haiku-4-5": TokenUsage(input_tokens=5000)})
    run = await run_scripted(
        [Reply([tool_use_block("research", {}, id="toolu_1")], usage=ScriptUsage(100, 20)), _answer()],
        tools=[spawn],
        spec={"limits": {"tokenBudget": 1000}},
    )
    assert run.outcome.stop_reason is StopReason.TOKEN_BUDGET_EXCEEDED
    assert len(run.requests) == 1


async def test_adopted_spend_is_not_counted_again_in_the_cost_metric() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(Metrics(registry), namespace="default", started_monotonic=0.0)
    spawn = SpawningTool("research", usage={"claude-sonnet-4-6": TokenUsage(input_tokens=1_000_000)})
    run = await run_scripted(
        [Reply([tool_use_block("research", {}, id="toolu_1")], usage=ScriptUsage(100_000, 0)), _answer()],
        tools=[spawn],
        spec={"model": {"name": "claude-sonnet-4-6"}},
        observers=[observer],
    )
    assert run.finished.progress.cost_usd is not None and run.finished.progress.cost_usd > Decimal(3)
    counted = registry.get_sample_value("agentrun_cost_usd_total", {"namespace": "default"}) or 0.0
    # Only the run's own two requests: 100k + 10 input, 5 output at $3/$15 per million.
    assert math.isclose(counted, (100_010 * 3 + 5 * 15) / 1_000_000)


async def test_a_tool_without_a_per_call_limit_outlives_the_runs_tool_timeout() -> None:
    spawn = SpawningTool("research", delay=1.2)
    run = await run_scripted(
        [Reply([tool_use_block("research", {}, id="toolu_1")]), _answer()],
        tools=[spawn],
        spec={"limits": {"toolTimeoutSeconds": 1}},
    )
    result = run.requests[1].body["messages"][-1]["content"][0]
    assert "is_error" not in result and result["content"] == "child of toolu_1 done"


async def test_a_tools_own_timeout_replaces_the_runs_tool_timeout() -> None:
    spawn = SpawningTool("research", delay=0.5, timeout_seconds=0.05)
    run = await run_scripted(
        [Reply([tool_use_block("research", {}, id="toolu_1")]), _answer()],
        tools=[spawn],
        spec={"limits": {"toolTimeoutSeconds": 60}},
    )
    result = run.requests[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True and "0.05s" in result["content"]
