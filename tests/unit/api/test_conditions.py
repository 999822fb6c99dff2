"""Run states → Kubernetes conditions, including what kstatus (Flux, Argo CD) reads as health."""

from __future__ import annotations

from agentrun.api.conditions import RESULT_LIMIT, bounded_result, conditions_for
from agentrun.api.status import Phase


def _by_type(conditions: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {str(c["type"]): c for c in conditions}


def test_running_run_is_reconciling_and_succeeded_unknown() -> None:
    c = _by_type(conditions_for(Phase.RUNNING, reason="Running", message="m", now="t1", generation=1))
    assert c["Succeeded"]["status"] == "Unknown"
    assert c["Reconciling"]["status"] == "True"
    assert c["Ready"]["status"] == "False"
    assert c["Stalled"]["status"] == "False"


def test_run_awaiting_approval_is_reconciling_not_stalled_with_reason_awaiting_approval() -> None:
    c = _by_type(
        conditions_for(Phase.AWAITING_APPROVAL, reason="Running", message="m", now="t1", generation=1)
    )
    assert (c["Reconciling"]["status"], c["Reconciling"]["reason"]) == ("True", "AwaitingApproval")
    assert (c["Succeeded"]["status"], c["Succeeded"]["reason"]) == ("Unknown", "AwaitingApproval")
    assert c["Ready"]["status"] == "False"
    assert c["Stalled"]["status"] == "False"


def test_succeeded_run_is_ready_and_not_reconciling() -> None:
    c = _by_type(conditions_for(Phase.SUCCEEDED, reason="EndTurn", message="m", now="t1", generation=2))
    assert (c["Succeeded"]["status"], c["Succeeded"]["reason"]) == ("True", "EndTurn")
    assert c["Ready"]["status"] == "True"
    assert c["Reconciling"]["status"] == "False"
    assert c["Succeeded"]["observedGeneration"] == 2


def test_failed_run_is_stalled_with_the_stop_reason() -> None:
    c = _by_type(conditions_for(Phase.FAILED, reason="MaxIterations", message="m", now="t1", generation=1))
    assert (c["Succeeded"]["status"], c["Succeeded"]["reason"]) == ("False", "MaxIterations")
    assert (c["Stalled"]["status"], c["Stalled"]["reason"]) == ("True", "MaxIterations")


def test_last_transition_time_moves_only_when_the_status_value_changes() -> None:
    first = conditions_for(Phase.RUNNING, reason="Running", message="a", now="t1", generation=1)
    again = _by_type(
        conditions_for(Phase.RUNNING, reason="Running", message="b", now="t2", generation=1, previous=first)
    )
    assert again["Succeeded"]["lastTransitionTime"] == "t1"
    done = _by_type(
        conditions_for(Phase.SUCCEEDED, reason="EndTurn", message="c", now="t3", generation=1, previous=first)
    )
    assert done["Succeeded"]["lastTransitionTime"] == "t3"


def test_result_is_bounded_and_marked_when_cut() -> None:
    text, cut = bounded_result("x" * (RESULT_LIMIT + 10))
    assert text is not None and len(text.encode()) == RESULT_LIMIT and cut
    assert bounded_result("short") == ("short", False)
    assert bounded_result(None) == (None, False)
