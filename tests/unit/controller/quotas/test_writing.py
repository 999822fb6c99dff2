"""The quota ledger writer against the emulator: batches, conflicts re-applied, exact totals."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest

from agentrun.controller.quotas.writing import QuotaGone, QuotaWriter
from agentrun.kube.calling import KubeClient
from agentrun.kube.retrying import KubeRetryPolicy
from agentrun.quotas.ledger import Admitted, Blocked, Ledger, Reserved
from agentrun_sandbox.kube import EmulatedCluster
from tests.unit.controller.quotas.conftest import QuotaFactory

FAST = KubeRetryPolicy(attempts=3, first_seconds=0.01, max_seconds=0.01)


class Copy:
    """What one process knows of the quota: its writer's own reads and writes (no watch)."""

    def __init__(self, obj: Mapping[str, Any] | None) -> None:
        self.obj = dict(obj) if obj is not None else None

    def latest(self) -> Mapping[str, Any] | None:
        return self.obj

    def written(self, obj: dict[str, Any]) -> None:
        self.obj = obj


def writer_for(kube: KubeClient, copy: Copy, name: str = "team") -> QuotaWriter:
    return QuotaWriter(kube, "default", name, latest=copy.latest, written=copy.written, retry=FAST)


def admitting(uid: str) -> Any:
    def change(ledger: Ledger, now: dt.datetime) -> Admitted | Blocked:
        return ledger.admit(uid, f"run-{uid}", now)

    return change


def reserving(uid: str, request: str, tokens: int) -> Any:
    def change(ledger: Ledger, now: dt.datetime) -> Reserved | Blocked:
        return ledger.reserve(uid, f"run-{uid}", request, "op/1", tokens, Decimal("0.01"), now)

    return change


def settling(uid: str, request: str, tokens: int) -> Any:
    def change(ledger: Ledger, now: dt.datetime) -> None:
        ledger.settle(uid, request, tokens, Decimal("0.005"), now)

    return change


async def test_many_runs_admitted_at_once_share_a_few_writes_and_the_limit_holds(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quota = await make_quota(hard={"concurrentRuns": 10})
    copy = Copy(quota)
    writer = writer_for(kube, copy)
    verdicts = await asyncio.gather(*(writer.apply(admitting(f"u{i:02}")) for i in range(30)))
    assert sum(isinstance(v, Admitted) for v in verdicts) == 10
    assert all(isinstance(v, Blocked) and v.limit == "concurrentRuns" for v in verdicts[10:])
    assert writer.writes <= 2, writer.writes  # the first change alone, then the other 29 together
    stored = await kube.get_quota("default", "team")
    assert sorted(entry["uid"] for entry in stored["status"]["admitted"]) == [f"u{i:02}" for i in range(10)]
    assert stored["status"]["used"]["concurrentRuns"] == 10


async def test_two_writers_racing_on_one_quota_re_apply_their_changes_and_the_totals_stay_exact(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quota = await make_quota(hard={"tokens": 1000})
    # Two processes, both starting from the same version: whichever writes second meets a 409.
    first, second = writer_for(kube, Copy(quota)), writer_for(kube, Copy(quota))

    async def reserve_all(writer: QuotaWriter, who: str) -> list[Any]:
        return list(
            await asyncio.gather(*(writer.apply(reserving(f"{who}{i}", "r1", 10)) for i in range(60)))
        )

    firsts, seconds = await asyncio.gather(reserve_all(first, "a"), reserve_all(second, "b"))
    reserved = [v for v in firsts + seconds if isinstance(v, Reserved)]
    waiting = [v for v in firsts + seconds if isinstance(v, Blocked)]
    assert len(reserved) == 100 and len(waiting) == 20
    assert all(not v.final for v in waiting)  # they fit against used alone: they wait, not fail
    assert first.conflicts + second.conflicts >= 1
    stored = await kube.get_quota("default", "team")
    assert stored["status"]["reserved"]["tokens"] == 1000
    assert len(stored["status"]["reservations"]) == 100

    # Every reservation settles to half of it, through either writer: used is the exact sum.
    held = [e for e in stored["status"]["reservations"]]
    await asyncio.gather(
        *(
            (first if i % 2 else second).apply(settling(entry["uid"], entry["id"], 5))
            for i, entry in enumerate(held)
        )
    )
    stored = await kube.get_quota("default", "team")
    assert stored["status"]["used"]["tokens"] == 500
    assert stored["status"]["reserved"]["tokens"] == 0
    assert stored["status"]["reservations"] == [] or "reservations" not in stored["status"]


async def test_a_transient_failure_of_the_write_is_retried_and_the_caller_sees_one_result(
    cluster: EmulatedCluster, kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quota = await make_quota(hard={"concurrentRuns": 1})
    cluster.emulator.faults.add(method="PUT", path=re.compile(r".*/agentrunquotas/team/status$"), status=503)
    writer = writer_for(kube, Copy(quota))
    assert isinstance(await writer.apply(admitting("u1")), Admitted)
    assert isinstance(await writer.apply(admitting("u2")), Blocked)
    stored = await kube.get_quota("default", "team")
    assert [entry["uid"] for entry in stored["status"]["admitted"]] == ["u1"]


async def test_a_change_that_changes_nothing_writes_nothing(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quota = await make_quota(hard={"concurrentRuns": 1})
    copy = Copy(quota)
    writer = writer_for(kube, copy)
    await writer.apply(admitting("u1"))
    version = copy.obj and copy.obj["metadata"]["resourceVersion"]
    assert isinstance(await writer.apply(admitting("u1")), Admitted)  # already admitted: not again
    assert isinstance(await writer.apply(admitting("u2")), Blocked)  # held back: nothing to write
    assert writer.writes == 1
    assert (await kube.get_quota("default", "team"))["metadata"]["resourceVersion"] == version


async def test_a_deleted_quota_answers_quota_gone(kube: KubeClient, make_quota: QuotaFactory) -> None:
    quota = await make_quota(hard={"concurrentRuns": 1})
    await kube._custom.delete_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", "default", "agentrunquotas", "team"
    )
    writer = writer_for(kube, Copy(quota))
    with pytest.raises(QuotaGone, match="default/team was deleted"):
        await writer.apply(admitting("u1"))
