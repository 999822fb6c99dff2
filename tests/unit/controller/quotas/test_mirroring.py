"""The copy of a PostgreSQL ledger in its quota's status: the totals without the lists, written by the
replica that looks after the quota, one write for a burst of versions, never an older one."""

from __future__ import annotations

from agentrun.controller.quotas.mirroring import LedgerMirror, ledger_copy
from agentrun.kube.calling import KubeClient
from agentrun.stores.quota_ledgers import LedgerRow
from tests.support.waiting import until
from tests.unit.controller.quotas.conftest import QuotaFactory

ADMITTED = [{"uid": "uid-a", "name": "a", "at": "2026-11-28T00:00:00Z"}]


def row(uid: str, version: int, concurrent: int) -> LedgerRow:
    status = {
        "used": {"concurrentRuns": concurrent, "runs": version, "tokens": 0, "costUSD": "0"},
        "summary": {"concurrentRuns": f"{concurrent}/5"},
        "admitted": ADMITTED * concurrent,
        "reservations": [],
    }
    return LedgerRow(uid, "default", "team", version, status)


def test_the_copy_keeps_the_totals_and_the_lists_lengths_and_removes_the_lists() -> None:
    copy = ledger_copy(row("u", 7, 1))
    assert copy["used"]["concurrentRuns"] == 1 and copy["summary"]["concurrentRuns"] == "1/5"
    assert copy["admitted"] is None and copy["reservations"] is None  # a merge patch removes them
    assert copy["ledger"] == {"store": "postgres", "version": 7, "admitted": 1, "reservations": 0}


async def test_a_burst_of_versions_is_one_write_of_the_newest_and_an_older_one_is_never_written(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quota = await make_quota(hard={"concurrentRuns": 5})
    uid = quota["metadata"]["uid"]
    mirror = LedgerMirror(kube, lambda _uid: True, delay=0.2)
    for version in (1, 2, 3):
        mirror.saw(row(uid, version, version))
    status = await until(
        lambda: kube.get_quota("default", "team"),
        "the copy",
        done=lambda q: (q.get("status") or {}).get("ledger", {}).get("version") == 3,
    )
    assert status["status"]["used"]["concurrentRuns"] == 3 and "admitted" not in status["status"]
    assert mirror.writes == 1
    mirror.saw(row(uid, 2, 2))  # a late read of an older version: nothing to copy, no write pending
    assert not mirror.pending()
    await mirror.close()


async def test_a_replica_that_does_not_look_after_the_quota_writes_no_copy(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quota = await make_quota(hard={"concurrentRuns": 5})
    mirror = LedgerMirror(kube, lambda _uid: False, delay=0.0)
    mirror.saw(row(quota["metadata"]["uid"], 1, 1))
    assert not mirror.pending() and mirror.writes == 0
    await mirror.close()
