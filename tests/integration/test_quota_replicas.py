"""One quota line across operator replicas: the runs of a namespace are admitted in one order,
whichever replica owns each (controller/quotas/lines.py), and each says how many wait ahead of it
on every replica.

Two real operator processes of one replica group share the runs; a quota admits one run at a time,
and each admitted run holds its place until the test cancels it. Which replica owns a run is worked
out as the replicas do (rendezvous hashing of its uid, controller/replicas/ring.py), so the scenario
knows it has runs on both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentrun.controller.replicas.ring import owner
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, SlowResponse, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import cancel_run, request, until, wait_finished
from tests.support.postgres import PostgresServer, running_postgres
from tests.support.quotas import create_quota, install_quota_crd, ledger_row, quota_status
from tests.support.replicas import ReplicaGroup, replica_group

pytestmark = pytest.mark.slow

TAG = "[quota-line]"
WAIT = 60.0
REPLICAS = ("q0", "q1")
#: Runs are created until both replicas own some, and at least this many.
AT_LEAST = 4
AT_MOST = 12


def held_run(cluster: TestCluster, name: str) -> dict[str, Any]:
    return agentrun(
        name,
        f"{TAG} {name}",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5", "maxTokens": 64},
    )


Admitted = Callable[[], Awaitable[list[str]]]


def admitted_in_status(cluster: TestCluster) -> Admitted:
    async def admitted() -> list[str]:
        return [entry["uid"] for entry in (await quota_status(cluster, "line")).get("admitted") or []]

    return admitted


def admitted_in_row(postgres: PostgresServer) -> Admitted:
    async def admitted() -> list[str]:
        return [entry["uid"] for entry in (await ledger_row(postgres)).get("admitted") or []]

    return admitted


@pytest.mark.parametrize("ledger", ["status", "postgres"])
async def test_runs_owned_by_different_replicas_are_admitted_in_one_namespace_order(
    cluster: TestCluster, tmp_path: Path, ledger: str
) -> None:
    await install_quota_crd(cluster)
    await create_quota(cluster, "line", hard={"concurrentRuns": 1})
    held = Script(TAG, [Reply([text_block("late")], faults=(SlowResponse(seconds=600),))])
    env = {"AGENTRUN_STATUS_INTERVAL_SECONDS": "1", "AGENTRUN_QUOTA_LEDGER": ledger}
    async with contextlib.AsyncExitStack() as stack:
        admitted = admitted_in_status(cluster)
        if ledger == "postgres":  # the ledger in a row both replicas lock in turn
            postgres = await stack.enter_async_context(running_postgres(tmp_path))
            env["AGENTRUN_DATABASE_URL"] = postgres.dsn
            admitted = admitted_in_row(postgres)
        model = await stack.enter_async_context(FakeMessagesAPI(scripts=[held]).running())
        group = await stack.enter_async_context(replica_group(cluster, model, tmp_path, env))
        owners = await in_one_order(cluster, model, group, admitted)
        # Each run was executed (here: admitted, then cancelled) by the replica that owns it: both took
        # part, and neither admitted a run the other owned.
        for name, replica in owners.items():
            assert f"/{name}] finished" in group.replicas[replica].process.logs(), (name, replica)


async def in_one_order(
    cluster: TestCluster, model: FakeMessagesAPI, group: ReplicaGroup, admitted: Admitted
) -> dict[str, str]:
    """Runs waiting behind a run that holds the quota, owned by both replicas, admitted one at a time
    in the namespace's order; the waiting runs' names and the replica that owns each."""
    for name in REPLICAS:
        await group.start(name)
    await group.wait_for_members(len(REPLICAS))
    created = await request(cluster, "POST", cluster.runs_path, json=held_run(cluster, "line-00"))
    uids = {"line-00": created["metadata"]["uid"]}
    await until(lambda: len(model.requests_for(TAG)) == 1, "the first run to hold the quota", WAIT)

    # Runs waiting behind it, in name order (created one after another: the line's order too),
    # until each replica owns at least one of them.
    owners: dict[str, str] = {}
    while len(owners) < AT_LEAST or len(set(owners.values())) < len(REPLICAS):
        assert len(owners) < AT_MOST, f"every waiting run hashed to one replica: {owners}"
        name = f"line-{len(owners) + 1:02d}"
        created = await request(cluster, "POST", cluster.runs_path, json=held_run(cluster, name))
        uids[name] = created["metadata"]["uid"]
        owners[name] = owner(uids[name], REPLICAS) or ""
    waiting = sorted(owners)

    async def lines() -> dict[str, tuple[Any, ...]]:
        found = {}
        for name in waiting:
            status = ((await cluster.get_run(name)) or {}).get("status") or {}
            found[name] = (status.get("phase"), status.get("quotaWait"), status.get("message") or "")
        return found

    # Each says how many runs wait ahead of it on both replicas, and what holds it back.
    last = waiting[-1]
    ahead = f"{len(waiting) - 1} runs of the namespace ahead of it"
    seen = await until(
        lines,
        f"every run to wait, {last} with {ahead}",
        WAIT,
        done=lambda found: (
            all(f[0] == "Pending" and f[1] for f in found.values()) and ahead in found[last][2]
        ),
    )
    assert seen[waiting[0]][1] == {"quota": "line", "limit": "concurrentRuns"}, seen[waiting[0]]

    # Each time the admitted run ends, the next by the namespace's order is admitted, on whichever
    # replica owns it: never a run of the other replica that came later.
    current = "line-00"
    for following in waiting:
        await cancel_run(cluster, current)
        await wait_finished(cluster, current, timeout=WAIT)
        got = await until(admitted, f"{following} to be admitted", WAIT, done=bool)
        assert got == [uids[following]], (following, got, uids)
        current = following
    await cancel_run(cluster, current)
    await wait_finished(cluster, current, timeout=WAIT)
    return owners
