"""A namespace's quota line over the replicas: who at its front may write, and who is ahead of whom."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from agentrun.controller.quotas.lines import Candidate, Elsewhere, Lineup, Queue, writers
from agentrun.quotas.ledger import SandboxUse

NOW = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
SANDBOX = SandboxUse(cpu=Decimal(1), memory=Decimal(2**30))


def quota(**hard: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRunQuota",
        "metadata": {"name": "team", "namespace": "default", "resourceVersion": "1"},
        "spec": {"hard": hard},
    }


def here(name: str, second: int, *, sandbox: bool = False) -> Candidate:
    return Candidate(
        "default",
        name,
        f"uid-{name}",
        f"2026-11-28T00:00:{second:02d}Z",
        sandbox=SANDBOX if sandbox else None,
    )


def there(name: str, second: int, limit: str = "concurrentRuns") -> Elsewhere:
    return Elsewhere("default", name, f"uid-{name}", f"2026-11-28T00:00:{second:02d}Z", 0, limit)


def test_the_runs_at_the_front_a_quota_has_room_for_may_all_write() -> None:
    line = [here(f"r{i}", i) for i in range(5)]
    assert writers(line, [quota(concurrentRuns=3)], NOW) == {"uid-r0", "uid-r1", "uid-r2"}


def test_a_run_waiting_on_another_replica_stops_the_line_behind_it() -> None:
    line = [here("a", 1), there("b", 2), here("c", 3)]
    assert writers(line, [quota(concurrentRuns=10)], NOW) == {"uid-a"}


def test_a_run_elsewhere_held_by_a_sandbox_limit_holds_back_only_runs_with_a_sandbox() -> None:
    line = [there("a", 1, "sandboxCPU"), here("b", 2, sandbox=True), here("c", 3)]
    assert writers(line, [quota(concurrentRuns=10)], NOW) == {"uid-c"}


def test_a_run_here_the_sandbox_limits_hold_back_lets_runs_without_a_sandbox_pass() -> None:
    line = [here("a", 1, sandbox=True), here("b", 2, sandbox=True), here("c", 3)]
    assert writers(line, [quota(concurrentRuns=10, concurrentSandboxes=0)], NOW) == {"uid-c"}


def test_a_full_limit_stops_the_line_for_everyone_behind() -> None:
    line = [here("a", 1), here("b", 2)]
    assert writers(line, [quota(concurrentRuns=0)], NOW) == frozenset()


def test_runs_ahead_count_every_replicas_runs_but_a_run_admitted_meanwhile() -> None:
    queue = Queue()
    mine = here("c", 3)
    queue.enter(mine)
    queue.saw_elsewhere(there("a", 1), "uid-a")
    queue.saw_elsewhere(there("b", 2, "concurrentSandboxes"), "uid-b")
    objects = [quota(concurrentRuns=0)]
    lineup = Lineup.of(queue, objects, NOW)
    assert lineup.ahead_of(mine) == 1  # b waits for a sandbox only: not ahead of a run without one
    assert lineup.ahead_of(here("c", 3, sandbox=True)) == 2
    objects[0]["status"] = {"admitted": [{"uid": "uid-a", "name": "a", "at": "2026-11-28T00:00:05Z"}]}
    assert Lineup.of(queue, objects, NOW).ahead_of(mine) == 0  # its status still says it waits


def test_a_run_that_no_longer_waits_elsewhere_wakes_the_runs_here() -> None:
    queue = Queue()
    queue.saw_elsewhere(there("a", 1), "uid-a")
    moved = queue.moved
    queue.saw_elsewhere(None, "uid-a")
    assert moved.is_set() and queue.line() == []
