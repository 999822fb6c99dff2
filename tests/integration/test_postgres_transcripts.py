"""The PostgreSQL transcript store: a real PostgreSQL server (tests/support/postgres.py), the real operator.

Same guarantees as the Secret store: rows instead of Secrets, deletion removes the rows, and a database
outage keeps the run waiting at its checkpoint (its status says so) instead of losing or repeating steps.
Resume after SIGKILL at each moment is test_durable_runs.py's kill tests, which run once per store.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentrun.api.transcripts import StoredChunk, TranscriptCorrupt
from agentrun.controller.agentruns.postgres_chunks import PostgresChunks
from agentrun.controller.agentruns.transcript_storing import RunIdentity, TranscriptConflict
from agentrun.stores.postgres import TranscriptDatabase
from agentrun_sandbox.messages.api import FakeMessagesAPI
from tests.integration.test_durable_runs import (
    API_KEY,
    WAIT,
    Webhook,
    assert_succeeded_once_each,
    durable_script,
    steps_requested,
    webhook_manifest,
)
from tests.integration.test_plugin import plugin
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request, until
from tests.support.operator_process import OperatorProcess
from tests.support.postgres import PostgresServer
from tests.support.transcript_stores import postgres_store, rows_of, secrets_of

SCRIPTS = [
    durable_script("[pg:plain]"),
    durable_script("[pg:outage]"),
]
OperatorFactory = Callable[..., Awaitable[OperatorProcess]]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY)
    async with api.running() as server:
        yield server


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    hook = Webhook()
    await hook.start()
    try:
        yield hook
    finally:
        await hook.stop()


@pytest.fixture
async def start_operator(
    cluster: TestCluster, model: FakeMessagesAPI, postgres: PostgresServer, tmp_path: Path
) -> AsyncIterator[OperatorFactory]:
    started: list[OperatorProcess] = []

    async def start(env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> OperatorProcess:
        process = OperatorProcess(
            kubeconfig=cluster.kubeconfig,
            log_path=tmp_path / f"operator-{len(started)}.log",
            env={
                "ANTHROPIC_API_KEY": API_KEY,
                "ANTHROPIC_BASE_URL": model.url,
                **postgres_store(cluster, postgres).env,
                **(env or {}),
            },
            args=cluster.operator_args(args),
        )
        await process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        await process.stop()


async def test_a_run_in_the_postgres_store_keeps_its_chunks_as_rows_and_deleting_it_removes_them(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    postgres: PostgresServer,
    start_operator: OperatorFactory,
) -> None:
    tag = "[pg:plain]"
    await start_operator()
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "rows", tag, webhook))
    obj = await assert_succeeded_once_each(postgres_store(cluster, postgres), webhook, "rows", repeated=None)
    uid = obj["metadata"]["uid"]
    assert steps_requested(model, tag) == Counter({0: 1, 1: 1, 2: 1, 3: 1})
    assert await secrets_of(cluster, uid) == []
    rows = await postgres.query(
        "SELECT namespace, run_name FROM agentrun_transcript_chunks WHERE run_uid = $1", uid
    )
    assert {(r["namespace"], r["run_name"]) for r in rows} == {(cluster.namespace, "rows")}
    # The plugin reads the rows with the DSN it is given, and without one says where to give it.
    missing = await plugin(cluster, "transcript", "rows")
    assert missing.code == 1 and "--database-url or AGENTRUN_DATABASE_URL" in missing.err, missing
    shown = await plugin(cluster, "transcript", "rows", "--database-url", postgres.dsn)
    assert shown.code == 0 and "all three recorded" in shown.out, shown
    traced = await plugin(cluster, "trace", "rows", "-o", "json", "--database-url", postgres.dsn)
    assert traced.code == 0, traced
    assert [row["iteration"] for row in json.loads(traced.out)] == [1, 2, 3, 4]

    await request(cluster, "DELETE", f"{cluster.runs_path}/rows")

    async def rows_gone() -> bool:
        return await rows_of(postgres, uid) == []

    await until(rows_gone, "the deleted run's rows to be deleted", timeout=WAIT)


def store_unavailable(run: dict[str, Any]) -> bool:
    conditions = (run.get("status") or {}).get("conditions") or []
    return any(c.get("reason") == "TranscriptStoreUnavailable" for c in conditions)


async def test_a_database_outage_keeps_the_run_at_its_checkpoint_and_says_so_until_it_is_back(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    postgres: PostgresServer,
    start_operator: OperatorFactory,
) -> None:
    tag = "[pg:outage]"
    webhook.hold = {"toolu_w2"}
    # The second tool result is deferred: the next write is the third answer's, which asks for toolu_w3.
    await start_operator({"AGENTRUN_TRANSCRIPT_FLUSH_SECONDS": "600"})
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "outage", tag, webhook))
    await asyncio.wait_for(webhook.held.wait(), WAIT)
    await postgres.stop()
    webhook.release.set()

    async def waiting() -> dict[str, Any] | None:
        run: dict[str, Any] = await request(cluster, "GET", f"{cluster.runs_path}/outage")
        return run if store_unavailable(run) else None

    run = await until(waiting, "the status to say the transcript store is unavailable", timeout=WAIT)
    message = next(
        c["message"] for c in run["status"]["conditions"] if c["reason"] == "TranscriptStoreUnavailable"
    )
    assert "transcript database is unreachable" in message
    assert run["status"]["phase"] == "Running"
    await asyncio.sleep(3)  # blocked at the checkpoint: the tool it asked for does not run meanwhile
    assert [key.rpartition(":")[2] for key in webhook.keys] == ["toolu_w1", "toolu_w2"]
    assert steps_requested(model, tag) == Counter({0: 1, 1: 1, 2: 1})

    await postgres.start()
    done = await assert_succeeded_once_each(
        postgres_store(cluster, postgres), webhook, "outage", repeated=None
    )
    assert steps_requested(model, tag) == Counter({0: 1, 1: 1, 2: 1, 3: 1})
    assert not store_unavailable(done)


async def test_the_sweep_at_start_deletes_old_rows_of_runs_gone_from_the_served_namespaces_only(
    cluster: TestCluster, postgres: PostgresServer, start_operator: OperatorFactory
) -> None:
    database = await TranscriptDatabase.connect(postgres.dsn)
    try:
        await database.ensure_schema()
        for uid, namespace, age in (
            ("gone-old", cluster.namespace, "1 hour"),
            ("gone-young", cluster.namespace, "1 minute"),
            ("elsewhere-old", "not-served-here", "1 hour"),
        ):
            await database.insert_chunk(
                run_uid=uid, namespace=namespace, run_name=uid, chunk=StoredChunk(0, 0, 1, b"x")
            )
            await postgres.query(
                "UPDATE agentrun_transcript_chunks SET created_at = now() - $2::text::interval "
                "WHERE run_uid = $1",
                uid,
                age,
            )
    finally:
        await database.close()
    await start_operator(args=("--namespace", cluster.namespace))

    async def swept() -> bool:
        rows = await postgres.query("SELECT run_uid FROM agentrun_transcript_chunks")
        return "gone-old" not in {r["run_uid"] for r in rows}

    await until(swept, "the sweep at start", timeout=WAIT)
    rows = await postgres.query("SELECT run_uid FROM agentrun_transcript_chunks ORDER BY run_uid")
    assert [r["run_uid"] for r in rows] == ["elsewhere-old", "gone-young"]


async def test_a_chunk_written_again_is_accepted_with_its_bytes_refused_with_others_and_a_hole_refuses_resume(
    postgres: PostgresServer,
) -> None:
    database = await TranscriptDatabase.connect(postgres.dsn)
    try:
        await database.ensure_schema()
        chunks = PostgresChunks(database, RunIdentity("ns", "run", "uid-1"))
        first = StoredChunk(0, 0, 1, b"first record")
        await chunks.create(first)
        await chunks.create(first)  # our own earlier attempt, retried: the same bytes
        with pytest.raises(TranscriptConflict):
            await chunks.create(StoredChunk(0, 0, 1, b"someone else's record"))
        await chunks.create(StoredChunk(1, 0, 1, b"second"))
        await chunks.create(StoredChunk(3, 0, 1, b"after a gap"))
        assert [c.index for c in await chunks.read(known=2)] == [0, 1]  # chunks after a gap are not its
        await postgres.query("DELETE FROM agentrun_transcript_chunks WHERE idx = 1")
        with pytest.raises(TranscriptCorrupt, match="status counts 2 chunks"):
            await chunks.read(known=2)
    finally:
        await database.close()
