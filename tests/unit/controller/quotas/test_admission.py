"""Admission by the quotas of a namespace: in order, woken by quota changes, and without the CRD."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from decimal import Decimal

import pytest
from prometheus_client import CollectorRegistry

from agentrun.api.status import QuotaWait
from agentrun.controller.quotas.admission import Announce, Announcements, Candidate, HeldBack
from agentrun.controller.quotas.control import Quotas
from agentrun.controller.quotas.lines import Elsewhere
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun.quotas.ledger import SandboxUse
from agentrun_sandbox.kube import EmulatedCluster
from tests.support.clocks import ManualTime
from tests.support.waiting import until
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

    def announcer(name: str) -> Announce:
        async def announce(reason: str, message: str, wait: QuotaWait) -> None:
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
    last = await until(
        lambda: said.get("old", [""])[-1], "old to say a run is ahead of it", done=lambda m: "ahead" in m
    )
    assert admitted == []
    assert "QuotaExceeded" in last and "default/team" in last
    assert "1 run of the namespace ahead" in last

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

    async def announce(reason: str, message: str, wait: QuotaWait) -> None:
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

        async def announce(reason: str, message: str, wait: QuotaWait) -> None:
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
    in_line: set[str] = set()

    def announcer(name: str) -> Announce:
        async def announce(reason: str, message: str, wait: QuotaWait) -> None:
            in_line.add(name)

        return announce

    holder = candidate("holder", created="2026-01-01T00:00:00Z")
    assert await quotas.gate.admit(holder, asyncio.Event(), announcer("holder"))
    admitted: list[str] = []

    async def wait(run: Candidate) -> None:
        assert await quotas.gate.admit(run, asyncio.Event(), announcer(run.name))
        admitted.append(run.name)

    older, later = (
        candidate("older", created="2026-01-01T00:00:01Z"),
        candidate("later", created="2026-01-01T00:00:02Z"),
    )
    waiting = [asyncio.create_task(wait(older)), asyncio.create_task(wait(later))]
    await until(lambda: in_line == {"older", "later"}, "both runs to wait in line")
    quotas.gate.reprioritise("default", later.uid, 10)
    await quotas.gate.release("default", holder.uid)
    await asyncio.wait_for(asyncio.shield(waiting[1]), 5)
    assert admitted == ["later"]
    await quotas.gate.release("default", later.uid)
    await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert admitted == ["later", "older"]


async def test_a_run_without_a_sandbox_passes_runs_waiting_for_one_and_a_run_with_one_does_not(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentSandboxes": 1})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test", announce_interval=0)
    said: dict[str, str] = {}

    def announcer(name: str) -> Announce:
        async def announce(reason: str, message: str, wait: QuotaWait) -> None:
            said[name] = f"{reason}: {message}"

        return announce

    box = SandboxUse(cpu=Decimal("0.5"), memory=Decimal(2**27))

    def boxed(name: str, created: str) -> Candidate:
        return Candidate("default", name, f"uid-{name}", created=created, sandbox=box)

    admitted: list[str] = []

    async def wait(run: Candidate) -> None:
        assert await quotas.gate.admit(run, asyncio.Event(), announcer(run.name))
        admitted.append(run.name)

    holder = boxed("holder", "2026-01-01T00:00:00Z")
    assert await quotas.gate.admit(holder, asyncio.Event(), announcer("holder"))
    second = asyncio.create_task(wait(boxed("second", "2026-01-01T00:00:01Z")))
    await until(lambda: "concurrentSandboxes" in said.get("second", ""), "the second to wait for a sandbox")

    # Younger, but it needs no sandbox: admitted at once, not behind the run waiting for one.
    plain = candidate("plain", created="2026-01-01T00:00:02Z")
    assert await asyncio.wait_for(quotas.gate.admit(plain, asyncio.Event(), announcer("plain")), 5)
    assert "plain" not in said
    # A younger run with a sandbox waits behind the older one.
    third = asyncio.create_task(wait(boxed("third", "2026-01-01T00:00:03Z")))
    await until(lambda: "ahead" in said.get("third", ""), "the third to wait in line")
    assert said["third"].endswith("; 1 run of the namespace ahead of it"), said["third"]

    await quotas.gate.release("default", holder.uid)
    await asyncio.wait_for(asyncio.shield(second), 5)
    assert admitted == ["second"]
    await quotas.gate.release("default", "uid-second")
    await asyncio.wait_for(third, 5)
    status = (await kube.get_quota("default", "team"))["status"]
    assert [entry["uid"] for entry in status["admitted"]] == ["uid-plain", "uid-third"]
    assert status["used"]["concurrentSandboxes"] == 1 and status["used"]["sandboxCPU"] == "500m"


async def test_a_waiting_run_shows_new_numbers_at_most_once_per_announce_interval(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"tokens": 1000})
    time = ManualTime()
    quotas = Quotas(
        kube,
        Metrics(CollectorRegistry()),
        identity="test",
        announce_interval=10,
        clock=time,
        sleep=time.sleep,
    )
    await quotas.write(
        "default", "team", lambda ledger, now: ledger.reserve("u0", "a", "r0", "op/1", 1000, None, now)
    )
    said: list[str] = []

    async def announce(reason: str, message: str, wait: QuotaWait) -> None:
        said.append(message)

    cancel = asyncio.Event()
    waiter = asyncio.create_task(quotas.gate.admit(candidate("waiter", created="t"), cancel, announce))
    try:
        await until(lambda: said, "the run to say why it waits")
        assert len(said) == 1 and "1000 reserved" in said[0]
        # Same quota and limit, new numbers: not rewritten at once (every settle would rewrite
        # every waiting run's status); the gate looks again when the interval is over.
        await quotas.write("default", "team", lambda ledger, now: ledger.settle("u0", "r0", 1000, None, now))
        await until(
            lambda: time.sleeping,
            "the gate to wait for the end of the interval",
            done=lambda left: len(left) == 1 and 10 <= left[0] <= 10.5,
        )
        assert len(said) == 1
        time.advance(9)
        await until(lambda: time.sleeping, "the gate to go on waiting", done=lambda left: left == [1.5])
        assert len(said) == 1
        time.advance(1.5)
        await until(lambda: len(said) == 2, "the new numbers once the interval is over")
        assert "(1000 used in" in said[1]
    finally:
        cancel.set()
        assert await asyncio.wait_for(waiter, 5) is False


def test_a_waiting_run_says_a_new_reason_at_once_and_new_numbers_once_per_interval() -> None:
    said = Announcements(interval=10)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    full = HeldBack("quota default/team: tokens 900 of 1000 used", ("team", "tokens"))
    assert said.due(full, start)
    said.record(full, start)
    assert not said.due(full, start + dt.timedelta(seconds=60))  # nothing new to say
    fuller = HeldBack("quota default/team: tokens 950 of 1000 used", ("team", "tokens"))
    assert not said.due(fuller, start + dt.timedelta(seconds=9))
    assert said.due(fuller, start + dt.timedelta(seconds=10))
    in_line = HeldBack("waiting for 1 run of namespace default ahead of it in quota order", ("", "order"))
    assert said.due(in_line, start + dt.timedelta(seconds=1))


async def test_runs_a_quota_has_room_for_are_admitted_together_not_one_write_each(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 1})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    holder = candidate("holder", created="2026-01-01T00:00:00Z")
    assert await quotas.gate.admit(holder, asyncio.Event(), _silent)
    said: set[str] = set()

    def announcer(name: str) -> Announce:
        async def announce(reason: str, message: str, wait: QuotaWait) -> None:
            said.add(name)

        return announce

    runs = [candidate(f"r{i}", created=f"2026-01-01T00:00:0{i + 1}Z") for i in range(6)]
    waiting = [
        asyncio.create_task(quotas.gate.admit(run, asyncio.Event(), announcer(run.name))) for run in runs
    ]
    await until(lambda: len(said), "every run to say it waits", done=lambda n: n == len(runs))
    writer = quotas._writers[("default", "team")]
    before = writer.writes
    raised = await kube.get_quota("default", "team")
    raised["spec"]["hard"]["concurrentRuns"] = 7  # room for all six beside the holder
    stored = await kube._custom.replace_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentrunquotas", "team", raised
    )
    quotas.view.update(stored)  # as the watch of AgentRunQuotas passes it on
    assert all(await asyncio.wait_for(asyncio.gather(*waiting), 10))
    status = (await kube.get_quota("default", "team"))["status"]
    assert sorted(entry["uid"] for entry in status["admitted"]) == sorted(
        [holder.uid] + [r.uid for r in runs]
    )
    # The six admissions went together (one write; two at most when a run woke a turn late), not
    # six in turn.
    assert writer.writes - before <= 2


async def test_a_run_waiting_on_another_replica_is_admitted_before_a_younger_run_here(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 1})
    here = Quotas(kube, Metrics(CollectorRegistry()), identity="here")
    there = Quotas(kube, Metrics(CollectorRegistry()), identity="there")
    for quotas in (here, there):
        await quotas.gate.definitions("default")  # both watch the quota (listed on first use)
    holder = candidate("holder", created="2026-01-01T00:00:00Z")
    assert await there.gate.admit(holder, asyncio.Event(), _silent)
    here.view.update(await kube.get_quota("default", "team"))
    old = candidate("old", created="2026-01-01T00:00:01Z")
    young = candidate("young", created="2026-01-01T00:00:02Z")
    said: dict[str, str] = {}

    async def old_says(reason: str, message: str, wait: QuotaWait) -> None:
        # What its status says, as the other replica's watch of AgentRuns passes it on.
        said["old"] = message
        here.gate.saw_elsewhere(
            "default", old.uid, Elsewhere("default", "old", old.uid, old.created, 0, wait.limit)
        )

    async def young_says(reason: str, message: str, wait: QuotaWait) -> None:
        said["young"] = message

    old_admitted = asyncio.create_task(there.gate.admit(old, asyncio.Event(), old_says))
    await until(lambda: said.get("old", ""), "the old run to wait", done=bool)
    young_admitted = asyncio.create_task(here.gate.admit(young, asyncio.Event(), young_says))
    await until(lambda: said.get("young", ""), "the young run to wait", done=bool)
    assert "1 run of the namespace ahead of it" in said["young"]

    # The holder ends on a third replica; this one's watch sees the room first: its young run must
    # still let the old one, which waits on the other replica, go first.
    third = Quotas(kube, Metrics(CollectorRegistry()), identity="third")
    await third.gate.definitions("default")
    await third.gate.release("default", holder.uid)
    here.view.update(await kube.get_quota("default", "team"))
    await asyncio.sleep(0.2)  # time for the young run to (wrongly) write, were it first in its own line
    assert not young_admitted.done()
    there.view.update(await kube.get_quota("default", "team"))
    assert await asyncio.wait_for(old_admitted, 10)
    await asyncio.sleep(0.2)
    assert not young_admitted.done()
    assert [e["uid"] for e in (await kube.get_quota("default", "team"))["status"]["admitted"]] == [old.uid]

    here.gate.saw_elsewhere("default", old.uid, None)  # its status moved on: it runs
    await there.gate.release("default", old.uid)
    here.view.update(await kube.get_quota("default", "team"))
    assert await asyncio.wait_for(young_admitted, 10)


async def _silent(reason: str, message: str, wait: QuotaWait) -> None:
    raise AssertionError(f"a run with room waited: {message}")
