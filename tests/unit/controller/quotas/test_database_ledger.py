"""Quota ledgers in PostgreSQL (AGENTRUN_QUOTA_LEDGER=postgres): a real server, the emulator, two
"replicas" (two Quotas over one database) admitting into one quota at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry

from agentrun.api.status import QuotaWait
from agentrun.controller.quotas.control import Quotas
from agentrun.controller.quotas.lines import Candidate
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun.stores.quota_ledgers import TABLE, QuotaLedgerDatabase
from tests.support.postgres import PostgresServer
from tests.support.waiting import until
from tests.unit.controller.quotas.conftest import QuotaFactory


@contextlib.asynccontextmanager
async def replica(kube: KubeClient, dsn: str, name: str, **options: Any) -> AsyncIterator[Quotas]:
    ledgers = await QuotaLedgerDatabase.connect(dsn)
    await ledgers.ensure_schema()
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity=name, ledgers=ledgers, **options)
    listening = asyncio.create_task(quotas.keep_listening())
    try:
        yield quotas
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
        await quotas.mirror.close()
        await ledgers.close()


def run(name: str, second: int) -> Candidate:
    return Candidate("default", name, f"uid-{name}", f"2026-11-28T00:00:{second:02d}Z")


async def waits(reason: str, message: str, wait: QuotaWait) -> None:
    pass


async def test_two_replicas_admitting_at_once_never_pass_the_limit_and_never_conflict(
    kube: KubeClient, make_quota: QuotaFactory, postgres: PostgresServer
) -> None:
    await make_quota(hard={"concurrentRuns": 3})
    async with replica(kube, postgres.dsn, "a") as a, replica(kube, postgres.dsn, "b") as b:
        runs = [run(f"r{i}", i) for i in range(8)]
        admitting = [
            asyncio.create_task((a if i % 2 else b).gate.admit(r, asyncio.Event(), waits))
            for i, r in enumerate(runs)
        ]
        await until(lambda: sum(t.done() for t in admitting), "three admissions", done=lambda n: n == 3)
        await asyncio.sleep(0.3)  # time for a fourth to (wrongly) get in
        assert sum(t.done() for t in admitting) == 3
        [row] = await postgres.query(f"SELECT status FROM {TABLE}")
        assert '"concurrentRuns":3' in row["status"]

        # Each replica's view has the other's admissions from PostgreSQL's notifications, not the watch.
        for quotas in (a, b):
            seen = await until(
                lambda quotas=quotas: len(
                    (quotas.view.get("default", "team") or {})["status"].get("admitted") or []
                ),
                "both views to list the three admitted runs",
                done=lambda n: n == 3,
            )
            assert seen == 3
        # The quota's status is a copy of the totals, without the lists, written by one replica.
        copied = await until(
            lambda: kube.get_quota("default", "team"),
            "the copy of the ledger in the quota's status",
            done=lambda q: (q.get("status") or {}).get("summary", {}).get("concurrentRuns") == "3/3",
        )
        status = copied["status"]
        assert "admitted" not in status and "reservations" not in status
        assert status["ledger"]["store"] == "postgres" and status["ledger"]["admitted"] == 3

        # Each run admitted ends in turn: every run gets in, never more than three at once.
        released: set[str] = set()
        while len(released) < len(runs):
            running = [r for r, t in zip(runs, admitting, strict=True) if t.done() and r.uid not in released]
            assert 0 < len(running) <= 3
            await a.gate.release("default", running[0].uid)
            released.add(running[0].uid)
            expected = min(3, len(runs) - len(released))
            await until(
                lambda: sum(t.done() for t in admitting) - len(released),
                "the next run to be admitted",
                done=lambda n, expected=expected: n == expected,
            )
        assert all(t.result() is True for t in admitting)
        # Every change went into the row once: the row's version counts the writers' changes.
        writers = [q._writers[("default", "team")] for q in (a, b)]
        [row] = await postgres.query(f"SELECT version FROM {TABLE}")
        assert row["version"] == sum(w.writes for w in writers)


async def test_an_existing_status_ledger_moves_into_its_row_and_the_status_keeps_its_totals(
    kube: KubeClient, make_quota: QuotaFactory, postgres: PostgresServer
) -> None:
    await make_quota(hard={"concurrentRuns": 2})
    before = Quotas(kube, Metrics(CollectorRegistry()), identity="before")
    assert await before.gate.admit(run("old", 1), asyncio.Event(), waits)  # in the status, as before
    async with replica(kube, postgres.dsn, "after") as after:
        # Admitted before the move: counted, so one more fits and a third waits.
        assert await after.gate.admit(run("new", 2), asyncio.Event(), waits)
        third = asyncio.create_task(after.gate.admit(run("third", 3), asyncio.Event(), waits))
        await asyncio.sleep(0.3)
        assert not third.done()
        [row] = await postgres.query(f"SELECT status FROM {TABLE}")
        assert "uid-old" in row["status"] and "uid-new" in row["status"]
        await after.gate.release("default", "uid-old")
        assert await asyncio.wait_for(third, 10)


def _status(obj: dict[str, Any] | None) -> dict[str, Any]:
    return dict((obj or {}).get("status") or {})


async def test_an_admission_waits_out_a_database_outage_and_is_stored_once_it_is_back(
    kube: KubeClient, make_quota: QuotaFactory, postgres: PostgresServer
) -> None:
    await make_quota(hard={"concurrentRuns": 5})
    async with replica(kube, postgres.dsn, "a") as a:
        await a.gate.definitions("default")
        await postgres.stop()
        admitting = asyncio.create_task(a.gate.admit(run("patient", 1), asyncio.Event(), waits))
        await asyncio.sleep(1.0)  # the writer meets the outage and waits (OUTAGE_RETRY_SECONDS)
        assert not admitting.done()
        await postgres.start()
        assert await asyncio.wait_for(admitting, 30)
        [row] = await postgres.query(f"SELECT status FROM {TABLE}")
        assert "uid-patient" in row["status"]


async def test_deleting_a_quota_deletes_its_ledger_row(
    kube: KubeClient, make_quota: QuotaFactory, postgres: PostgresServer
) -> None:
    quota = await make_quota(hard={"concurrentRuns": 5})
    async with replica(kube, postgres.dsn, "a") as a:
        assert await a.gate.admit(run("one", 1), asyncio.Event(), waits)
        assert len(await postgres.query(f"SELECT 1 FROM {TABLE}")) == 1
        a.observe("DELETED", quota)  # the watch event of the deletion
        await until(
            lambda: postgres.query(f"SELECT 1 FROM {TABLE}"), "the row to go", done=lambda rows: not rows
        )
        assert a.view.get("default", "team") is None


async def test_a_waiting_run_sees_room_a_ledger_change_made_without_a_new_quota_object(
    kube: KubeClient, make_quota: QuotaFactory, postgres: PostgresServer
) -> None:
    """The quota object's resourceVersion does not change with its row: a look worked out before the
    release must not be taken for the answer after it (the run would wait for a timer; here, none)."""
    await make_quota(hard={"concurrentRuns": 1})

    async def never(seconds: float) -> None:
        await asyncio.Event().wait()

    async with replica(kube, postgres.dsn, "a", sleep=never) as a:
        holder = run("holder", 1)
        assert await a.gate.admit(holder, asyncio.Event(), waits)
        said = asyncio.Event()

        async def announce(reason: str, message: str, wait: QuotaWait) -> None:
            said.set()

        # Looks are worked out once per change and second: the next run's first look (the quota full)
        # and the release come early in one second, after the holder's admission in an earlier one.
        await asyncio.sleep(1.05 - time.time() % 1.0)
        waiting = asyncio.create_task(a.gate.admit(run("next", 2), asyncio.Event(), announce))
        await asyncio.wait_for(said.wait(), 10)
        await a.gate.release("default", holder.uid)
        assert await asyncio.wait_for(waiting, 10)
