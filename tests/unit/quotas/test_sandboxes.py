"""Sandboxes against a quota: concurrentSandboxes, sandboxCPU and sandboxMemory count the limits of the
sandboxes of admitted runs, hold back only runs with a sandbox, and survive a status round trip."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun.quotas.ledger import Admitted, Blocked, Ledger, QuotaDefinition, QuotaSpecError, SandboxUse
from agentrun.quotas.quantities import parse_quantity
from tests.unit.quotas.quota_objects import at, definition, quota_object

NOW = at("2026-11-24T09:20:00Z")


def box(cpu: str, memory: str) -> SandboxUse:
    return SandboxUse(cpu=parse_quantity(cpu), memory=parse_quantity(memory))


SMALL = box("500m", "512Mi")


def _blocked(verdict: Admitted | Blocked) -> Blocked:
    assert isinstance(verdict, Blocked), verdict
    return verdict


def test_concurrent_sandboxes_hold_back_a_run_with_a_sandbox_until_one_ends() -> None:
    ledger = Ledger(definition(hard={"concurrentSandboxes": 1}))
    assert ledger.admit("u1", "first", NOW, sandbox=SMALL) == Admitted()
    blocked = _blocked(ledger.admit("u2", "second", NOW, sandbox=SMALL))
    assert (blocked.limit, blocked.room_at, blocked.final) == ("concurrentSandboxes", None, False)
    assert blocked.message == (
        "quota research/team: concurrentSandboxes limit 1 reached (1 sandbox running); "
        "room expected when one of the 1 run with a sandbox ends"
    )
    ledger.release("u1")
    assert ledger.admit("u2", "second", NOW, sandbox=SMALL) == Admitted()


def test_runs_without_a_sandbox_are_neither_held_back_nor_counted_by_the_sandbox_limits() -> None:
    ledger = Ledger(definition(hard={"concurrentSandboxes": 1, "sandboxCPU": "1", "sandboxMemory": "1Gi"}))
    assert ledger.admit("u1", "boxed", NOW, sandbox=SMALL) == Admitted()
    for index in range(5):
        assert ledger.admit(f"plain-{index}", "plain", NOW) == Admitted()
    assert ledger.sandboxes() == (1, SMALL)
    status = ledger.status(NOW, 1)
    assert status["used"]["concurrentRuns"] == 6
    assert status["used"]["concurrentSandboxes"] == 1


def test_sandbox_cpu_sums_the_cpu_limits_and_holds_back_a_sandbox_that_does_not_fit() -> None:
    ledger = Ledger(definition(hard={"sandboxCPU": "2"}))
    assert ledger.admit("u1", "a", NOW, sandbox=box("1500m", "1Gi")) == Admitted()
    assert ledger.admit("u2", "b", NOW, sandbox=box("500m", "1Gi")) == Admitted()  # exactly 2
    blocked = _blocked(ledger.admit("u3", "c", NOW, sandbox=box("1m", "1Mi")))
    assert (blocked.limit, blocked.final) == ("sandboxCPU", False)
    assert blocked.message == (
        "quota research/team: sandboxCPU limit 2 has room for less than this run's sandbox (1m): "
        "2 held by 2 sandboxes running; room expected when one of the 2 runs with a sandbox ends"
    )
    ledger.release("u2")
    assert ledger.admit("u3", "c", NOW, sandbox=box("1m", "1Mi")) == Admitted()
    assert ledger.status(NOW, 1)["summary"]["sandboxCPU"] == "1501m/2"


def test_sandbox_memory_sums_the_memory_limits_exactly_across_suffixes() -> None:
    ledger = Ledger(definition(hard={"sandboxMemory": "1Gi"}))
    assert ledger.admit("u1", "a", NOW, sandbox=box("1", "0.5Gi")) == Admitted()
    assert ledger.admit("u2", "b", NOW, sandbox=box("1", "524288Ki")) == Admitted()  # 512Mi: exactly 1Gi
    blocked = _blocked(ledger.admit("u3", "c", NOW, sandbox=box("1", "1")))
    assert blocked.limit == "sandboxMemory"
    assert "sandboxMemory limit 1Gi" in blocked.message and "1Gi held by 2 sandboxes" in blocked.message
    assert ledger.status(NOW, 1)["used"]["sandboxMemory"] == "1Gi"


def test_a_sandbox_bigger_than_a_whole_limit_is_refused_for_good() -> None:
    ledger = Ledger(definition(hard={"sandboxMemory": "1Gi"}))
    blocked = _blocked(ledger.admit("u1", "huge", NOW, sandbox=box("1", "2Gi")))
    assert (blocked.limit, blocked.final) == ("sandboxMemory", True)
    assert blocked.message == (
        "quota research/team: sandboxMemory limit 1Gi is less than this run's sandbox limit (2Gi) alone; "
        "room expected only when the quota is raised"
    )
    assert ledger.sandboxes() == (0, SandboxUse())


def test_a_sandbox_limit_of_zero_admits_no_run_with_a_sandbox_and_promises_no_room() -> None:
    ledger = Ledger(definition(hard={"concurrentSandboxes": 0}))
    blocked = _blocked(ledger.admit("u1", "a", NOW, sandbox=SMALL))
    assert blocked.message == (
        "quota research/team: concurrentSandboxes limit is 0 (no run with a sandbox); "
        "room expected only when the quota is raised"
    )
    assert ledger.admit("u2", "plain", NOW) == Admitted()


def test_concurrent_runs_are_checked_before_the_sandbox_limits() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 1, "concurrentSandboxes": 1}))
    ledger.admit("u1", "a", NOW, sandbox=SMALL)
    assert _blocked(ledger.admit("u2", "b", NOW, sandbox=SMALL)).limit == "concurrentRuns"


def test_the_status_shows_each_admitted_sandbox_and_the_sums_against_the_limits() -> None:
    ledger = Ledger(definition(hard={"concurrentSandboxes": 3, "sandboxCPU": "4", "sandboxMemory": "8Gi"}))
    ledger.admit("u1", "a", NOW, sandbox=box("1500m", "1Gi"))
    ledger.admit("u2", "b", NOW)
    ledger.admit("u3", "c", NOW, sandbox=box("1", "512Mi"))
    status = ledger.status(NOW, 1)
    assert status["used"] == {
        "concurrentRuns": 3,
        "runs": 3,
        "tokens": 0,
        "costUSD": "0",
        "concurrentSandboxes": 2,
        "sandboxCPU": "2500m",
        "sandboxMemory": "1536Mi",
    }
    summary = status["summary"]
    assert (summary["concurrentSandboxes"], summary["sandboxCPU"], summary["sandboxMemory"]) == (
        "2/3",
        "2500m/4",
        "1536Mi/8Gi",
    )
    assert [entry.get("sandbox") for entry in status["admitted"]] == [
        {"cpu": "1500m", "memory": "1Gi"},
        None,
        {"cpu": "1", "memory": "512Mi"},
    ]


def test_a_quota_that_neither_limits_nor_holds_a_sandbox_keeps_the_status_it_always_had() -> None:
    ledger = Ledger(definition(hard={"concurrentRuns": 2}))
    ledger.admit("u1", "a", NOW)
    status = ledger.status(NOW, 1)
    assert list(status["used"]) == ["concurrentRuns", "runs", "tokens", "costUSD"]
    assert list(status["summary"]) == ["concurrentRuns", "runs", "tokens", "costUSD"]
    # One holding a sandbox shows its use even without a sandbox limit (as "1", no "/limit").
    ledger.admit("u2", "b", NOW, sandbox=SMALL)
    assert ledger.status(NOW, 1)["summary"]["concurrentSandboxes"] == "1"


def _reloaded(ledger: Ledger, status: dict[str, Any]) -> Ledger:
    return Ledger.load(ledger.definition, status, NOW)


def test_a_restarted_operator_reads_the_sandboxes_back_and_keeps_holding_runs_back() -> None:
    ledger = Ledger(definition(hard={"concurrentSandboxes": 2, "sandboxCPU": "2"}))
    ledger.admit("u1", "a", NOW, sandbox=box("1500m", "1Gi"))
    ledger.admit("u2", "b", NOW)
    status = ledger.status(NOW, 1)
    again = _reloaded(ledger, status)
    assert again.sandboxes() == ledger.sandboxes()
    assert again.status(NOW, 1) == status
    assert _blocked(again.admit("u3", "c", NOW, sandbox=box("1", "1Gi"))).limit == "sandboxCPU"
    again.release("u1")
    assert again.admit("u3", "c", NOW, sandbox=box("1", "1Gi")) == Admitted()


def test_sandboxes_missing_from_the_admissions_are_held_by_placeholders_from_the_recorded_totals() -> None:
    ledger = Ledger(definition(hard={"concurrentSandboxes": 3, "sandboxCPU": "4", "sandboxMemory": "4Gi"}))
    ledger.admit("u1", "a", NOW, sandbox=box("1", "1Gi"))
    ledger.admit("u2", "b", NOW, sandbox=box("1", "1Gi"))
    status = ledger.status(NOW, 1)
    status["admitted"] = status["admitted"][:1]  # an entry lost (edited by hand)
    again = _reloaded(ledger, status)
    assert again.sandboxes() == (2, box("2", "2Gi"))
    assert status["used"]["concurrentRuns"] == len(again.status(NOW, 1)["admitted"]) == 2
    placeholder = next(uid for uid in again.uids() if uid != "u1")
    assert placeholder.startswith("unaccounted-admission")
    again.release(placeholder)  # what the quota reconciler does: no run has that uid
    assert again.sandboxes() == (1, box("1", "1Gi"))


def test_an_unreadable_sandbox_with_unreadable_totals_is_taken_as_the_whole_limit() -> None:
    ledger = Ledger(definition(hard={"sandboxCPU": "4", "sandboxMemory": "4Gi"}))
    ledger.admit("u1", "a", NOW, sandbox=box("1", "1Gi"))
    status = ledger.status(NOW, 1)
    status["admitted"][0]["sandbox"] = {"cpu": "lots", "memory": "1Gi"}
    status["used"]["sandboxCPU"] = "???"
    again = _reloaded(ledger, status)
    count, held = again.sandboxes()
    assert held.cpu == Decimal(4) and held.memory >= Decimal(2**30)
    assert _blocked(again.admit("u2", "b", NOW, sandbox=box("1m", "1Mi"))).limit == "sandboxCPU"
    assert count >= 1


def test_a_status_written_before_sandboxes_were_counted_reads_as_no_sandbox() -> None:
    old = {
        "used": {"concurrentRuns": 1, "runs": 1, "tokens": 0, "costUSD": "0"},
        "admitted": [{"uid": "u1", "name": "a", "at": "2026-11-24T09:20:00Z"}],
    }
    ledger = Ledger.load(definition(hard={"concurrentSandboxes": 1}), old, NOW)
    assert ledger.sandboxes() == (0, SandboxUse())
    assert ledger.admit("u2", "b", NOW, sandbox=SMALL) == Admitted()


@pytest.mark.parametrize(
    ("hard", "message"),
    [
        ({"sandboxCPU": "1.2.3"}, "spec.hard.sandboxCPU: '1.2.3' is not a Kubernetes quantity"),
        ({"sandboxMemory": 512}, "spec.hard.sandboxMemory: 512 is not a Kubernetes quantity"),
        ({"concurrentSandboxes": -1}, "spec.hard.concurrentSandboxes must be a whole number >= 0, got -1"),
    ],
)
def test_a_sandbox_limit_the_ledger_cannot_count_is_refused_in_one_line(
    hard: dict[str, Any], message: str
) -> None:
    with pytest.raises(QuotaSpecError, match="AgentRunQuota research/team: " + message.replace(".", r"\.")):
        QuotaDefinition.from_object(quota_object(hard=hard))
