"""The quota gauges and refusal counter, fed from AgentRunQuota statuses on an injected registry."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agentrun.metrics.definitions import Metrics

STATUS: dict[str, Any] = {
    "observedGeneration": 3,
    "windowStart": "2026-11-01T00:00:00Z",
    "used": {"concurrentRuns": 2, "runs": 10, "tokens": 12345, "costUSD": "0.123456"},
    "reserved": {"tokens": 8192, "costUSD": "0.05"},
    "summary": {"concurrentRuns": "2/5", "runs": "10/100", "tokens": "12345/2000000", "costUSD": "0.12/50"},
    "lost": {"requests": 1, "tokens": 5000, "costUSD": "0.02"},
    "refused": {"runs": 3, "requests": 1},
}
HARD = {"concurrentRuns": 5, "runs": 100, "tokens": 2000000, "costUSD": 50}


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def quota_series(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if line.startswith("agentrun_quota_")]


def test_observe_quota_sets_hard_used_reserved_and_lost_from_the_status_and_spec_hard() -> None:
    registry = CollectorRegistry()
    Metrics(registry).observe_quota("team-a", "daily", STATUS, hard=HARD)
    q = {"namespace": "team-a", "quota": "daily"}
    assert {r: value(registry, "agentrun_quota_hard", **q, resource=r) for r in HARD} == {
        "concurrentRuns": 5,
        "runs": 100,
        "tokens": 2000000,
        "costUSD": 50,
    }
    assert {r: value(registry, "agentrun_quota_used", **q, resource=r) for r in HARD} == {
        "concurrentRuns": 2,
        "runs": 10,
        "tokens": 12345,
        "costUSD": pytest.approx(0.123456),
    }
    assert value(registry, "agentrun_quota_reserved", **q, resource="tokens") == 8192
    assert value(registry, "agentrun_quota_reserved", **q, resource="costUSD") == pytest.approx(0.05)
    assert value(registry, "agentrun_quota_lost_reservations", **q) == 1


def test_sandbox_limits_and_use_are_gauges_in_cores_and_bytes() -> None:
    registry = CollectorRegistry()
    status = {
        **STATUS,
        "used": {
            **STATUS["used"],
            "concurrentSandboxes": 2,
            "sandboxCPU": "1500m",
            "sandboxMemory": "1536Mi",
        },
    }
    hard = {"concurrentSandboxes": 3, "sandboxCPU": "4", "sandboxMemory": "8Gi"}
    Metrics(registry).observe_quota("team-a", "boxes", status, hard=hard)
    q = {"namespace": "team-a", "quota": "boxes"}
    assert {r: value(registry, "agentrun_quota_hard", **q, resource=r) for r in hard} == {
        "concurrentSandboxes": 3,
        "sandboxCPU": 4,
        "sandboxMemory": 8 * 2**30,
    }
    assert {r: value(registry, "agentrun_quota_used", **q, resource=r) for r in hard} == {
        "concurrentSandboxes": 2,
        "sandboxCPU": 1.5,
        "sandboxMemory": 1536 * 2**20,
    }
    assert (
        value(registry, "agentrun_quota_refusals_total", **q, resource="sandboxCPU", stage="admission") == 0
    )


def test_a_resource_without_a_hard_limit_has_no_hard_series_but_its_usage_is_still_shown() -> None:
    registry = CollectorRegistry()
    Metrics(registry).observe_quota("team-a", "tokens-only", STATUS, hard={"tokens": 1000})
    q = {"namespace": "team-a", "quota": "tokens-only"}
    assert value(registry, "agentrun_quota_hard", **q, resource="tokens") == 1000
    assert value(registry, "agentrun_quota_hard", **q, resource="costUSD") is None
    assert value(registry, "agentrun_quota_used", **q, resource="costUSD") == pytest.approx(0.123456)


def test_a_limit_removed_from_the_spec_loses_its_hard_series() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.observe_quota("team-a", "daily", STATUS, hard=HARD)
    metrics.observe_quota("team-a", "daily", STATUS, hard={"runs": 100})
    q = {"namespace": "team-a", "quota": "daily"}
    assert value(registry, "agentrun_quota_hard", **q, resource="costUSD") is None
    assert value(registry, "agentrun_quota_hard", **q, resource="runs") == 100


def test_without_the_spec_the_hard_limits_are_read_from_the_status_summary() -> None:
    registry = CollectorRegistry()
    status = {**STATUS, "summary": {"concurrentRuns": "2", "runs": "10/100", "costUSD": "0.12/50.5"}}
    Metrics(registry).observe_quota("team-a", "daily", status)
    q = {"namespace": "team-a", "quota": "daily"}
    assert value(registry, "agentrun_quota_hard", **q, resource="runs") == 100
    assert value(registry, "agentrun_quota_hard", **q, resource="costUSD") == 50.5
    assert value(registry, "agentrun_quota_hard", **q, resource="concurrentRuns") is None


def test_a_quota_without_a_status_yet_shows_zero_usage_against_its_limits() -> None:
    registry = CollectorRegistry()
    Metrics(registry).observe_quota("team-a", "new", None, hard={"costUSD": "12.5"})
    q = {"namespace": "team-a", "quota": "new"}
    assert value(registry, "agentrun_quota_hard", **q, resource="costUSD") == 12.5
    assert value(registry, "agentrun_quota_used", **q, resource="costUSD") == 0
    assert value(registry, "agentrun_quota_reserved", **q, resource="tokens") == 0
    assert value(registry, "agentrun_quota_lost_reservations", **q) == 0


def test_malformed_status_values_count_as_zero_instead_of_failing_the_watcher() -> None:
    registry = CollectorRegistry()
    status = {"used": {"costUSD": "not a number", "tokens": True}, "reserved": "nope", "lost": None}
    Metrics(registry).observe_quota("team-a", "odd", status, hard={"costUSD": "NaN"})
    q = {"namespace": "team-a", "quota": "odd"}
    assert value(registry, "agentrun_quota_used", **q, resource="costUSD") == 0
    assert value(registry, "agentrun_quota_used", **q, resource="tokens") == 0
    assert value(registry, "agentrun_quota_hard", **q, resource="costUSD") is None


def test_refusals_count_by_resource_and_stage_and_start_at_zero_for_every_limited_resource() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.observe_quota("team-a", "daily", STATUS, hard={"concurrentRuns": 5, "costUSD": 50})
    q = {"namespace": "team-a", "quota": "daily"}
    total = "agentrun_quota_refusals_total"
    assert value(registry, total, **q, resource="concurrentRuns", stage="admission") == 0
    assert value(registry, total, **q, resource="costUSD", stage="request") == 0
    assert value(registry, total, **q, resource="tokens", stage="request") is None
    metrics.quota_refused("team-a", "daily", "costUSD", "request")
    metrics.quota_refused("team-a", "daily", "costUSD", "request")
    metrics.quota_refused("team-a", "daily", "tokenBudget", "spec")
    assert value(registry, total, **q, resource="costUSD", stage="request") == 2
    assert value(registry, total, **q, resource="tokenBudget", stage="spec") == 1


def test_a_refusal_with_an_unknown_stage_is_a_programming_error() -> None:
    metrics = Metrics(CollectorRegistry())
    with pytest.raises(ValueError, match="admission, request, spec, not 'admit'"):
        metrics.quota_refused("team-a", "daily", "runs", "admit")


def test_forget_quota_removes_every_series_of_that_quota_and_only_of_that_quota() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.observe_quota("team-a", "daily", STATUS, hard=HARD)
    metrics.observe_quota("team-a", "monthly", STATUS, hard=HARD)
    metrics.observe_quota("team-b", "daily", STATUS, hard=HARD)
    metrics.quota_refused("team-a", "daily", "maxIterations", "spec")
    metrics.forget_quota("team-a", "daily")
    series = quota_series(registry)
    assert series
    assert not [s for s in series if 'namespace="team-a"' in s and 'quota="daily"' in s]
    assert [s for s in series if 'namespace="team-a"' in s and 'quota="monthly"' in s]
    assert [s for s in series if 'namespace="team-b"' in s and 'quota="daily"' in s]


def test_the_quota_metrics_have_the_contract_names_and_labels() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.observe_quota("team-a", "daily", STATUS, hard=HARD)
    metrics.quota_refused("team-a", "daily", "runs", "admission")
    labels = {
        sample.name: set(sample.labels)
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith("agentrun_quota_") and not sample.name.endswith("_created")
    }
    assert labels == {
        "agentrun_quota_hard": {"namespace", "quota", "resource"},
        "agentrun_quota_used": {"namespace", "quota", "resource"},
        "agentrun_quota_reserved": {"namespace", "quota", "resource"},
        "agentrun_quota_lost_reservations": {"namespace", "quota"},
        "agentrun_quota_refusals_total": {"namespace", "quota", "resource", "stage"},
    }
