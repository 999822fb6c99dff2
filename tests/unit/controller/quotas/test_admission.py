"""Admission by the quotas of a namespace: in order, woken by quota changes, and without the CRD."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from agentrun.controller.quotas.admission import Candidate
from agentrun.controller.quotas.control import Quotas
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun_sandbox.kube import EmulatedCluster
from tests.unit.controller.quotas.conftest import CRDS, QuotaFactory, client_of


def candidate(name: str, *, created: str, priority: int = 0) -> Candidate:
    return Candidate("default", name, f"uid-{name}", created=created, priority=priority)


async def test_waiting_runs_are_admitted_by_priority_then_age_as_room_appears(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 1})
    # Every change of the message written at once (the default writes new numbers once per interval).
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test", announce_interval=0)
    said: dict[str, list[str]] = {}

    def announcer(name: str) -> Callable[[str, str], Awaitable[None]]:
        async def announce(reason: str, message: str) -> None:
            said.setdefault(name, []).append(f"{reason}: {message}")

        return announce

    first = candidate("first", created="2026-01-01T00:00:00Z")
    assert await quotas.gate.admit(first, asyncio.Event(), announcer("first"))
    admitted: list[str] = []

    async def wait(run: Candidate) -> None:
        assert await quotas.gate.admit(run, asyncio.Event(), announcer(run.name))
        admitted.append(run.name)

    old = candidate("old", created="2026-01-01T00:00:01Z")
    young_but_urgent = candidate("urgent", created="2026-01-01T00:00:02Z", priority=5)
    waiting = [asyncio.create_task(wait(old)), asyncio.create_task(wait(young_but_urgent))]
    await asyncio.sleep(0.2)
    assert admitted == []
    assert "QuotaExceeded" in said["old"][-1] and "default/team" in said["old"][-1]
    assert "1 run of the namespace ahead" in said["old"][-1]

    await quotas.gate.release("default", first.uid)
    await asyncio.wait_for(asyncio.shield(waiting[1]), 5)
    assert admitted == ["urgent"]
    await quotas.gate.release("default", young_but_urgent.uid)
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert admitted == ["urgent", "old"]
    status = (await kube.get_quota("default", "team"))["status"]
    assert [entry["uid"] for entry in status["admitted"]] == ["uid-old"]
    assert status["used"]["runs"] == 3 and status["refused"]["runs"] == 2


async def test_a_run_cancelled_while_it_waits_leaves_the_line(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 0})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    cancel = asyncio.Event()

    async def announce(reason: str, message: str) -> None:
        cancel.set()

    assert not await quotas.gate.admit(candidate("never", created="t"), cancel, announce)


async def test_without_the_quota_crd_runs_are_admitted_and_one_warning_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        EmulatedCluster.running(crd_paths=[CRDS / "agentruns.agentrun.dev.yaml"]) as cluster,
        client_of(cluster) as kube,
    ):
        quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")

        async def announce(reason: str, message: str) -> None:
            raise AssertionError(f"a run without quotas waited: {reason}: {message}")

        with caplog.at_level(logging.WARNING, logger="agentrun.controller.quotas.watching"):
            for name in ("a", "b"):
                assert await quotas.gate.admit(candidate(name, created="t"), asyncio.Event(), announce)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "AgentRunQuota CRD is not installed" in warnings[0]


async def test_a_waiting_run_whose_priority_is_raised_goes_ahead_of_older_runs(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 1})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")

    async def quiet(reason: str, message: str) -> None:
        return None

    holder = candidate("holder", created="2026-01-01T00:00:00Z")
    assert await quotas.gate.admit(holder, asyncio.Event(), quiet)
    admitted: list[str] = []

    async def wait(run: Candidate) -> None:
        assert await quotas.gate.admit(run, asyncio.Event(), quiet)
        admitted.append(run.name)

    older, later = (
        candidate("older", created="2026-01-01T00:00:01Z"),
        candidate("later", created="2026-01-01T00:00:02Z"),
    )
    waiting = [asyncio.create_task(wait(older)), asyncio.create_task(wait(later))]
    await asyncio.sleep(0.1)
    quotas.gate.reprioritise("default", later.uid, 10)
    await quotas.gate.release("default", holder.uid)
    await asyncio.wait_for(asyncio.shield(waiting[1]), 5)
    assert admitted == ["later"]
    await quotas.gate.release("default", later.uid)
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert admitted == ["later", "older"]


async def test_a_waiting_run_shows_new_numbers_at_most_once_per_announce_interval(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"tokens": 1000})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test", announce_interval=0.6)
    await quotas.write(
        "default", "team", lambda ledger, now: ledger.reserve("u0", "a", "r0", "op/1", 1000, None, now)
    )
    said: list[str] = []

    async def announce(reason: str, message: str) -> None:
        said.append(message)

    cancel = asyncio.Event()
    waiter = asyncio.create_task(quotas.gate.admit(candidate("waiter", created="t"), cancel, announce))
    try:
        await asyncio.sleep(0.2)
        assert len(said) == 1 and "1000 reserved" in said[0]
        # Same quota and limit, new numbers: not rewritten at once (every settle would rewrite
        # every waiting run's status), but within the interval.
        await quotas.write("default", "team", lambda ledger, now: ledger.settle("u0", "r0", 1000, None, now))
        await asyncio.sleep(0.2)
        assert len(said) == 1
        await asyncio.sleep(1.0)
        assert len(said) == 2 and "(1000 used in" in said[1]
    finally:
        cancel.set()
        assert await asyncio.wait_for(waiter, 5) is False
