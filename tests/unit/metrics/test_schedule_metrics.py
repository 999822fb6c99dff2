"""The schedule metrics: a counter per result, and a next-time gauge that goes away with the schedule."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agentrun.metrics.definitions import Metrics

NEXT = "agentrun_schedule_next_run_timestamp_seconds"


def test_each_result_of_a_due_time_is_counted_per_schedule() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.schedule_time_handled("team", "nightly", "created")
    metrics.schedule_time_handled("team", "nightly", "skipped_forbid")
    text = generate_latest(registry).decode()
    assert 'agentrun_schedule_runs_total{namespace="team",result="created",schedule="nightly"} 1.0' in text
    assert (
        'agentrun_schedule_runs_total{namespace="team",result="skipped_forbid",schedule="nightly"} 1.0'
        in text
    )


def test_an_unknown_result_is_refused() -> None:
    with pytest.raises(ValueError, match="schedule result"):
        Metrics(CollectorRegistry()).schedule_time_handled("team", "nightly", "ran")


def test_the_next_time_gauge_is_removed_when_the_schedule_is_not_due() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.schedule_next("team", "nightly", 1_800_000_000.0)
    labels = {"namespace": "team", "schedule": "nightly"}
    assert registry.get_sample_value(NEXT, labels) == 1_800_000_000.0
    metrics.schedule_next("team", "nightly", None)
    metrics.schedule_next("team", "other", None)  # never set: nothing to remove, no error
    assert registry.get_sample_value(NEXT, labels) is None
