"""The Prometheus metrics the observer derives from a real loop run, on an injected registry."""

from __future__ import annotations

import platform
from decimal import Decimal

from prometheus_client import CollectorRegistry

from agentrun import __version__
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.api.usage import TokenUsage
from agentrun.loop.events import ApprovalDecided, ApprovalRequested, Checkpoint, RunFinished, RunStarted
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import UNDECLARED_TOOL, MetricsObserver
from agentrun_sandbox.messages.script import Reply, ScriptUsage, text_block, tool_use_block
from tests.support.loop_harness import FakeTool, run_scripted


class Cost:
    """Records the cost counter each time a checkpoint arrives (after the metrics observer)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.seen: list[float] = []

    async def notify(self, event: object) -> None:
        if isinstance(event, Checkpoint) and event.trace is not None:
            self.seen.append(
                self.registry.get_sample_value("agentrun_cost_usd_total", {"namespace": "ns"}) or 0
            )


class Wall:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _progress(cost: str | None, iterations: int = 1) -> Progress:
    return Progress(iterations, 0, TokenUsage(), Decimal(cost) if cost is not None else None)


async def test_cost_is_counted_as_each_response_is_priced_not_at_the_end() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(Metrics(registry), namespace="ns", started_monotonic=0.0)
    cost = Cost(registry)
    run = await run_scripted(
        [
            Reply([tool_use_block("t", {"q": "a"})], usage=ScriptUsage(1_000_000, 0)),
            Reply([text_block("done")], usage=ScriptUsage(1_000_000, 0)),
        ],
        tools=[FakeTool("t")],
        spec={"model": {"name": "claude-haiku-4-5"}},
        observers=[observer, cost],
    )
    total = float(run.finished.progress.cost_usd or 0)
    assert total > 0
    # Half of the spend is on the counter after the first response, all of it after the second.
    assert cost.seen[0] == total / 2
    assert cost.seen[-1] == total
    assert registry.get_sample_value("agentrun_cost_usd_total", {"namespace": "ns"}) == total


def _tool_labels(registry: CollectorRegistry) -> dict[str, set[str]]:
    """The `tool` label values of each family that has one."""
    found: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            if "tool" in sample.labels:
                found.setdefault(family.name, set()).add(sample.labels["tool"])
    return found


async def test_tool_names_the_model_invents_share_one_label_value_beside_the_declared_ones() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(Metrics(registry), namespace="ns", started_monotonic=0.0)
    ghost = tool_use_block("ghost_same", {"q": "again"})
    run = await run_scripted(
        [
            Reply([tool_use_block("lookup", {"q": "a"}), tool_use_block("ghost_v0", {"q": "b"})]),
            Reply([tool_use_block("ghost_v1", {"q": "c"})]),
            Reply([ghost]),
            Reply([ghost]),
            Reply([ghost]),
        ],
        tools=[FakeTool("lookup"), FakeTool("search")],
        observers=[observer],
    )
    assert run.finished.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert _tool_labels(registry) == {
        "agentrun_tool_calls": {"lookup", UNDECLARED_TOOL},
        "agentrun_tool_call_duration_seconds": {"lookup", UNDECLARED_TOOL},
        "agentrun_loop_detections": {UNDECLARED_TOOL},
    }
    calls = {"tool": UNDECLARED_TOOL, "outcome": "unknown_tool"}
    assert registry.get_sample_value("agentrun_tool_calls_total", calls) == 5
    assert registry.get_sample_value("agentrun_tool_calls_total", {"tool": "lookup", "outcome": "ok"}) == 1
    duration = {"tool": UNDECLARED_TOOL, "le": "+Inf"}
    assert registry.get_sample_value("agentrun_tool_call_duration_seconds_bucket", duration) == 5
    assert registry.get_sample_value("agentrun_loop_detections_total", {"tool": UNDECLARED_TOOL}) == 1


async def test_a_declared_tool_keeps_its_name_in_every_tool_metric() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(Metrics(registry), namespace="ns", started_monotonic=0.0)
    same = tool_use_block("lookup", {"q": "same"})
    text_call = '<tool_use>{"name": "lookup", "input": {"q": "text"}}</tool_use>'
    await run_scripted(
        [Reply([text_block(text_call)]), Reply([same]), Reply([same]), Reply([same])],
        tools=[FakeTool("lookup")],
        observers=[observer],
    )
    assert _tool_labels(registry) == {
        "agentrun_tool_calls": {"lookup"},
        "agentrun_tool_call_duration_seconds": {"lookup"},
        "agentrun_loop_detections": {"lookup"},
        "agentrun_tool_calls_recovered_from_text": {"lookup"},
    }


async def test_a_resumed_run_counts_only_the_spend_after_its_checkpoint() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(Metrics(registry), namespace="ns", started_monotonic=0.0)
    await observer.notify(RunStarted(resumed=True, progress=_progress("0.50")))
    await observer.notify(RunFinished(Outcome(StopReason.END_TURN, "done"), _progress("0.75", 2)))
    assert registry.get_sample_value("agentrun_cost_usd_total", {"namespace": "ns"}) == 0.25
    assert (
        registry.get_sample_value("agentrun_runs_started_total", {"namespace": "ns", "resumed": "true"}) == 1
    )


async def test_pending_approvals_go_up_and_down_and_are_released_when_the_run_ends() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    observer = MetricsObserver(metrics, namespace="ns", started_monotonic=0.0)
    for call in ("a", "b", "c"):
        await observer.notify(ApprovalRequested(1, call, "deploy", {}))
    await observer.notify(ApprovalDecided(1, "a", "deploy", True, "alice", None, False, 2.0))
    await observer.notify(ApprovalDecided(1, "b", "deploy", False, None, None, True, 600.0))
    assert registry.get_sample_value("agentrun_approvals_pending") == 1
    assert registry.get_sample_value("agentrun_approvals_decided_total", {"decision": "approved"}) == 1
    assert registry.get_sample_value("agentrun_approvals_decided_total", {"decision": "timed_out"}) == 1
    assert registry.get_sample_value("agentrun_approvals_decided_total", {"decision": "denied"}) == 0
    await observer.notify(RunFinished(Outcome(StopReason.CANCELLED, "cancelled"), _progress(None)))
    assert registry.get_sample_value("agentrun_approvals_pending") == 0


def test_oldest_running_run_age_is_computed_at_scrape_time_without_per_run_labels() -> None:
    registry = CollectorRegistry()
    wall = Wall(10_000.0)
    metrics = Metrics(registry, wall_clock=wall)
    assert registry.get_sample_value("agentrun_oldest_running_run_age_seconds") == 0
    metrics.run_began("uid-1", started_at=9_000.0)
    metrics.run_began("uid-2")
    wall.now = 10_500.0
    assert registry.get_sample_value("agentrun_oldest_running_run_age_seconds") == 1_500
    metrics.run_ended("uid-1")
    assert registry.get_sample_value("agentrun_oldest_running_run_age_seconds") == 500
    metrics.run_ended("uid-2")
    assert registry.get_sample_value("agentrun_oldest_running_run_age_seconds") == 0


def test_runs_active_counts_the_runs_between_their_start_and_their_end_here() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.run_began("uid-1")
    metrics.run_began("uid-2", started_at=9_000.0)
    assert registry.get_sample_value("agentrun_runs_active") == 2
    metrics.run_ended("uid-1")
    assert registry.get_sample_value("agentrun_runs_active") == 1
    metrics.run_ended("uid-2")
    assert registry.get_sample_value("agentrun_runs_active") == 0


async def test_a_run_that_ends_before_its_loop_is_counted_like_one_that_ends_in_it() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.run_finished("ns", StopReason.INVALID_SPEC)  # the reconciler's finish phase, no loop
    observer = MetricsObserver(metrics, namespace="ns", started_monotonic=0.0)
    await observer.notify(RunFinished(Outcome(StopReason.INVALID_SPEC, "bad tool"), _progress(None)))
    await observer.notify(RunFinished(Outcome(StopReason.END_TURN, "done"), _progress(None)))
    finished = "agentrun_runs_finished_total"
    assert (
        registry.get_sample_value(
            finished, {"namespace": "ns", "stop_reason": "InvalidSpec", "outcome": "failed"}
        )
        == 2
    )
    assert (
        registry.get_sample_value(
            finished, {"namespace": "ns", "stop_reason": "EndTurn", "outcome": "succeeded"}
        )
        == 1
    )


def test_heartbeat_and_build_info_are_exported_from_the_start() -> None:
    registry = CollectorRegistry()
    wall = Wall(1_700_000_000.0)
    metrics = Metrics(registry, wall_clock=wall)
    assert registry.get_sample_value("agentrun_operator_heartbeat_timestamp_seconds") == 1_700_000_000.0
    wall.now += 15
    metrics.beat()
    assert registry.get_sample_value("agentrun_operator_heartbeat_timestamp_seconds") == 1_700_000_015.0
    [info] = [s for m in registry.collect() if m.name == "agentrun_build_info" for s in m.samples]
    assert info.value == 1
    assert info.labels["version"] == __version__
    assert info.labels["python"] == platform.python_version()
    assert info.labels["kopf"][0].isdigit() and info.labels["anthropic"][0].isdigit()


async def test_run_duration_is_observed_when_the_run_finishes() -> None:
    registry = CollectorRegistry()

    class Clock:
        def monotonic(self) -> float:
            return 130.0

    observer = MetricsObserver(Metrics(registry), namespace="ns", started_monotonic=100.0, clock=Clock())
    await observer.notify(RunFinished(Outcome(StopReason.END_TURN, "done"), _progress(None, 4)))
    assert registry.get_sample_value("agentrun_run_duration_seconds_sum", {"namespace": "ns"}) == 30.0
    assert registry.get_sample_value("agentrun_run_iterations_sum", {"namespace": "ns"}) == 4
