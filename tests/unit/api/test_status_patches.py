"""Status patches are values of the status model: only declared fields, nulls only where meant."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun.api import status_patches
from agentrun.api.crd import crd
from agentrun.api.status import AgentRunStatus, Phase
from agentrun.api.status_patches import StatusPatch
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.api.usage import TokenUsage

PROGRESS = Progress(3, 2, TokenUsage(10, 20, 30, 40), Decimal("0.25"), ("claude-unknown",))


def _status_schema() -> dict[str, Any]:
    version = crd()["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def _undeclared(value: Any, schema: dict[str, Any], path: str = "status") -> list[str]:
    """Paths in ``value`` the CRD schema does not declare (the API server would prune them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict):
        found = []
        for key, item in value.items():
            if key not in schema.get("properties", {}):
                found.append(f"{path}.{key}")
            elif item is not None:
                found += _undeclared(item, schema["properties"][key], f"{path}.{key}")
        return found
    if isinstance(value, list):
        return [p for item in value for p in _undeclared(item, schema.get("items", {}), f"{path}[]")]
    return []


def _every_patch() -> list[StatusPatch]:
    waiting = status_patches.pending_approval("toolu_1", "deploy", {"replicas": 3}, "2026-01-01T00:00:00Z")
    conditioned = status_patches.conditioned(
        Phase.RUNNING, reason="Running", message="m", now="2026-01-01T00:00:00Z", generation=2
    )
    return [
        status_patches.pending(),
        status_patches.running("2026-01-01T00:00:00Z", clear_pending_approvals=True),
        status_patches.progressed(PROGRESS),
        status_patches.awaiting_approval([waiting]),
        status_patches.approvals_settled(),
        conditioned,
        *(
            status_patches.finished(Outcome(reason, "why", result="answer"), PROGRESS, now="t", generation=4)
            for reason in StopReason
        ),
    ]


@pytest.mark.parametrize("patch", _every_patch(), ids=lambda p: ",".join(sorted(p.fields)))
def test_every_status_patch_writes_only_fields_the_crd_declares(patch: StatusPatch) -> None:
    assert _undeclared(patch.body(), _status_schema()) == []


def test_a_cleared_field_is_written_as_null_and_a_later_set_wins_over_the_clear() -> None:
    cleared = status_patches.running("t0", clear_pending_approvals=True)
    assert cleared.body() == {"phase": "Running", "startTime": "t0", "pendingApprovals": None}
    waiting = status_patches.pending_approval("toolu_1", "deploy", {}, "t1")
    again = cleared.merged(status_patches.awaiting_approval([waiting]))
    assert again.body()["pendingApprovals"] == [
        {"toolUseId": "toolu_1", "toolName": "deploy", "input": {}, "since": "t1"}
    ]
    assert again.body()["phase"] == "AwaitingApproval"
    assert again.merged(status_patches.approvals_settled()).body()["pendingApprovals"] is None


def test_fields_left_unset_are_not_in_the_patch_so_the_server_keeps_them() -> None:
    body = status_patches.progressed(PROGRESS).body()
    assert set(body) == {"iterations", "toolCalls", "usage"}
    assert body["usage"] == {
        "inputTokens": 10,
        "outputTokens": 20,
        "cacheCreationInputTokens": 30,
        "cacheReadInputTokens": 40,
        "totalTokens": 100,
        "costUSD": "0.250000",
        "unpricedModels": ["claude-unknown"],
    }


def test_clearing_a_field_the_status_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="pendingApproval"):
        StatusPatch(AgentRunStatus(), frozenset({"pendingApproval"}))


@pytest.mark.parametrize(
    ("reason", "phase"),
    [
        (StopReason.END_TURN, "Succeeded"),
        (StopReason.CANCELLED, "Cancelled"),
        (StopReason.MAX_ITERATIONS, "Failed"),
    ],
)
def test_the_finished_status_names_phase_reason_counters_and_conditions(
    reason: StopReason, phase: str
) -> None:
    body = status_patches.finished(Outcome(reason, "why"), PROGRESS, now="t9", generation=5).body()
    assert body["phase"] == phase
    assert body["stopReason"] == reason.value
    assert body["completionTime"] == "t9"
    assert body["observedGeneration"] == 5
    assert body["iterations"] == 3
    assert body["message"] == "why"
    assert body["rawStopReason"] is None  # cleared: an earlier unrecognised reason does not linger
    succeeded = next(c for c in body["conditions"] if c["type"] == "Succeeded")
    assert succeeded["status"] == ("True" if phase == "Succeeded" else "False")
    assert succeeded["observedGeneration"] == 5


def test_a_long_result_is_cut_and_marked_truncated() -> None:
    body = status_patches.finished(
        Outcome(StopReason.END_TURN, "done", result="x" * 40_000), PROGRESS, now="t", generation=None
    ).body()
    assert body["resultTruncated"] is True
    assert len(body["result"]) == 32 * 1024
    assert "observedGeneration" in body and body["observedGeneration"] is None


def test_a_finished_run_with_a_newer_generation_gets_it_marked_observed_on_status_and_conditions() -> None:
    condition = {"status": "True", "reason": "Cancelled", "message": "", "lastTransitionTime": "t"}
    status = {
        "phase": "Cancelled",
        "observedGeneration": 1,
        "conditions": [
            {"type": "Stalled", **condition, "observedGeneration": 1},
            {"type": "Ready", **condition, "status": "False", "observedGeneration": 1},
        ],
    }
    patch = status_patches.observed(AgentRunStatus.model_validate(status), 2)
    assert patch is not None
    assert patch.body() == {
        "observedGeneration": 2,
        "conditions": [
            {"type": "Stalled", **condition, "observedGeneration": 2},
            {"type": "Ready", **condition, "status": "False", "observedGeneration": 2},
        ],
    }


def test_nothing_is_written_when_the_generation_is_already_observed_or_unknown() -> None:
    assert status_patches.observed(AgentRunStatus(observed_generation=3), 3) is None
    assert status_patches.observed(AgentRunStatus(), 3) is None
    assert status_patches.observed(AgentRunStatus(observed_generation=3), None) is None


def test_a_merged_patch_has_the_models_defaults_where_unset_and_none_of_them_shared() -> None:
    progress = Progress(2, 3, TokenUsage(input_tokens=10, output_tokens=5), None, ())
    first = status_patches.running("2026-11-24T10:00:00Z", clear_pending_approvals=False).merged(
        status_patches.progressed(progress)
    )
    second = status_patches.progressed(progress).merged(status_patches.progressed(progress))
    fresh = AgentRunStatus()
    for merged in (first, second):
        for name in AgentRunStatus.model_fields.keys() - merged.status.model_fields_set:
            assert getattr(merged.status, name) == getattr(fresh, name), name
    assert first.status.conditions is not second.status.conditions
    assert first.status.model_fields_set == {"phase", "start_time", "iterations", "tool_calls", "usage"}
    assert first.body()["iterations"] == 2


def _merged_field_by_field(first: StatusPatch, second: StatusPatch) -> tuple[dict[str, Any], frozenset[str]]:
    """What a merge means, spelled out: the second's set fields win, its clears drop the first's."""
    kept = {n: getattr(first.status, n) for n in first.status.model_fields_set - second.cleared}
    kept.update({n: getattr(second.status, n) for n in second.status.model_fields_set})
    return kept, (first.cleared - second.status.model_fields_set) | second.cleared


def test_every_pair_of_patches_merges_to_the_second_on_top_of_the_first_leaving_both_as_they_were() -> None:
    patches = _every_patch()
    for first in patches:
        for second in patches:
            before = (first.body(), set(first.status.model_fields_set), second.body())
            merged = first.merged(second)
            values, cleared = _merged_field_by_field(first, second)
            assert merged.status.model_fields_set == set(values)
            assert {n: getattr(merged.status, n) for n in values} == values
            assert merged.cleared == cleared
            fresh = AgentRunStatus()
            for name in AgentRunStatus.model_fields.keys() - set(values):
                assert getattr(merged.status, name) == getattr(fresh, name), name
            assert (first.body(), set(first.status.model_fields_set), second.body()) == before
