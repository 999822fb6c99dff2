"""Context management made visible and configurable: status, metrics, trace, windows per model."""

from __future__ import annotations

import pydantic
import pytest
from prometheus_client import CollectorRegistry

from agentrun.api import status_patches
from agentrun.api.spec import AgentRunSpec
from agentrun.api.traces import COMPACTION, TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.cli.plugin_rendering import render_trace
from agentrun.loop.config import LoopConfig, context_window_of
from agentrun.loop.events import ContextCompacted
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun.settings import Settings


def _compacted(number: int, before: int, after: int) -> ContextCompacted:
    return ContextCompacted(
        iteration=4 * number,
        compactions=number,
        tokens_before=before,
        tokens_after=after,
        turns=3,
        usage=TokenUsage(900, 120),
        tokens_removed=before - after,
    )


def test_status_context_is_written_in_camel_case_under_one_object() -> None:
    patch = status_patches.compacted(
        compactions=2, iteration=9, tokens_before=150_000, tokens_after=30_000, tokens_removed=240_000
    )
    assert patch.body() == {
        "context": {
            "compactions": 2,
            "lastCompactionIteration": 9,
            "tokensBefore": 150_000,
            "tokensAfter": 30_000,
            "tokensRemoved": 240_000,
        }
    }


async def test_metrics_count_compactions_and_the_tokens_they_removed() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(Metrics(registry), namespace="team-a", started_monotonic=0.0)
    await observer.notify(_compacted(1, 160_000, 40_000))
    await observer.notify(_compacted(2, 170_000, 50_000))
    assert registry.get_sample_value("agentrun_context_compactions_total") == 2
    assert registry.get_sample_value("agentrun_context_compaction_tokens_removed_total") == 240_000


def test_the_trace_shows_each_summary_request_with_what_it_did() -> None:
    rows = [
        TraceRow(1, "tool_use", (), TokenUsage(10_000, 50), "m"),
        TraceRow(1, COMPACTION, (), TokenUsage(400, 300, 0, 9_600), "m"),
        TraceRow(2, "end_turn", (), TokenUsage(2_000, 20), "m"),
    ]
    log = [{"iteration": 1, "turns": 1, "tokensBefore": 16_500, "tokensAfter": 2_100}]
    _header, first, summary, last = render_trace(rows, log).splitlines()
    assert summary.split()[:2] == ["1", "compaction"]
    assert "context compacted: 1 turns summarized, next request ~16500 -> ~2100 input tokens" in summary
    assert "compact" not in first and "compact" not in last


def test_the_operator_setting_beats_the_built_in_window_table_and_the_spec_beats_both() -> None:
    assert context_window_of("claude-sonnet-4-6") == 200_000
    assert context_window_of("some-unknown-model") is None
    windows = Settings.from_env({"AGENTRUN_CONTEXT_WINDOWS": "claude-sonnet-4*=1000000, my-model=32000"})
    assert windows.context_windows == (("claude-sonnet-4*", 1_000_000), ("my-model", 32_000))
    assert context_window_of("claude-sonnet-4-6", windows.context_windows) == 1_000_000
    assert context_window_of("my-model", windows.context_windows) == 32_000
    spec = AgentRunSpec.model_validate({"task": "t", "context": {"contextWindowTokens": 50_000}})
    config = LoopConfig.from_spec(spec, run_id="r", context_windows=windows.context_windows)
    assert config.context.window_tokens == 50_000
    assert config.context.threshold_tokens == 40_000


def test_context_management_is_on_by_default_with_safe_values() -> None:
    config = LoopConfig.from_spec(AgentRunSpec.model_validate({"task": "t"}), run_id="r").context
    assert (config.clear_tool_results, config.keep_tool_results, config.clear_min_chars) == (True, 8, 1024)
    assert config.clear_batch == 4
    assert (config.compaction, config.threshold_percent, config.keep_turns) == (True, 80, 2)
    assert config.window_tokens == 200_000


@pytest.mark.parametrize("value", ["claude*=12", "=5000", "claude*", "claude*=lots"])
def test_a_bad_context_window_setting_is_refused_naming_the_entry(value: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="context window entry"):
        Settings.from_env({"AGENTRUN_CONTEXT_WINDOWS": value})


@pytest.mark.parametrize(
    ("context", "field"),
    [
        ({"compaction": {"thresholdPercent": 99}}, "thresholdPercent"),
        ({"clearToolResults": {"keepNewest": 0}}, "keepNewest"),
        ({"contextWindowTokens": 10}, "contextWindowTokens"),
        ({"compaction": {"keepNewestTurns": 0}}, "keepNewestTurns"),
        ({"compact": {}}, "compact"),
    ],
)
def test_bad_context_settings_are_refused_by_the_spec_model(context: dict[str, object], field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        AgentRunSpec.model_validate({"task": "t", "context": context})
