"""A finished run's later spec change is marked observed, so kstatus reads the run as final."""

from __future__ import annotations

from agentrun.api.conditions import observed_generation_patch


def test_a_finished_run_with_a_newer_generation_gets_it_marked_observed_on_status_and_conditions() -> None:
    status = {
        "phase": "Cancelled",
        "observedGeneration": 1,
        "conditions": [
            {"type": "Stalled", "status": "True", "reason": "Cancelled", "observedGeneration": 1},
            {"type": "Ready", "status": "False", "reason": "Cancelled", "observedGeneration": 1},
        ],
    }
    assert observed_generation_patch(status, 2) == {
        "observedGeneration": 2,
        "conditions": [
            {"type": "Stalled", "status": "True", "reason": "Cancelled", "observedGeneration": 2},
            {"type": "Ready", "status": "False", "reason": "Cancelled", "observedGeneration": 2},
        ],
    }


def test_nothing_is_written_when_the_generation_is_already_observed_or_unknown() -> None:
    assert observed_generation_patch({"observedGeneration": 3, "conditions": []}, 3) is None
    assert observed_generation_patch({"conditions": []}, 3) is None
    assert observed_generation_patch({"observedGeneration": 3}, None) is None
