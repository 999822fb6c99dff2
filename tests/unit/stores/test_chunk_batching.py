"""Transcript rows of many runs in few statements (stores/chunk_batching.py), on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from agentrun.api.transcripts import StoredChunk
from agentrun.stores.postgres import UNAVAILABLE, TranscriptDatabase
from tests.support.postgres import PostgresServer


@pytest.fixture
async def database(postgres: PostgresServer) -> AsyncIterator[TranscriptDatabase]:
    database = await TranscriptDatabase.connect(postgres.dsn)
    await database.ensure_schema()
    try:
        yield database
    finally:
        await database.close()


def chunk(index: int, payload: bytes) -> StoredChunk:
    return StoredChunk(index, 0, 1, payload)


async def insert(database: TranscriptDatabase, uid: str, index: int, payload: bytes) -> bytes | None:
    return await database.insert_chunk(run_uid=uid, namespace="ns", run_name=uid, chunk=chunk(index, payload))


async def test_rows_of_many_runs_written_at_once_go_in_a_few_statements_and_all_are_stored(
    database: TranscriptDatabase,
) -> None:
    answers = await asyncio.gather(*(insert(database, f"run-{n}", 0, f"p{n}".encode()) for n in range(200)))
    assert answers == [None] * 200
    # The first few go out alone at once (up to four on the wire); the rest wait together for one of them.
    assert database._batcher.statements <= 10
    for n in (0, 57, 199):
        assert [c.payload for c in await database.read_chunks(f"run-{n}")] == [f"p{n}".encode()]


async def test_a_row_already_at_its_index_answers_with_the_stored_payload_in_a_batch(
    database: TranscriptDatabase,
) -> None:
    assert await insert(database, "kept", 0, b"first") is None
    answers = await asyncio.gather(
        *(insert(database, f"other-{n}", 0, b"x") for n in range(8)),
        insert(database, "kept", 0, b"second"),
        insert(database, "kept", 1, b"next"),
    )
    assert answers[:8] == [None] * 8
    assert answers[8:] == [b"first", None]
    assert [c.payload for c in await database.read_chunks("kept")] == [b"first", b"next"]


async def test_the_same_row_twice_in_one_statement_is_written_once_and_the_second_hears_the_first(
    database: TranscriptDatabase,
) -> None:
    blockers = [insert(database, f"busy-{n}", 0, b"b") for n in range(4)]  # the wire full: the rest wait
    answers = await asyncio.gather(
        *blockers, insert(database, "twice", 0, b"one"), insert(database, "twice", 0, b"two")
    )
    assert answers[4:] == [None, b"one"]
    assert [c.payload for c in await database.read_chunks("twice")] == [b"one"]


async def test_a_row_the_server_refuses_fails_only_its_own_insert_not_the_others_of_its_statement(
    database: TranscriptDatabase,
) -> None:
    async def bad() -> bytes | None:
        # PostgreSQL text cannot hold a NUL character: the whole statement is refused.
        return await database.insert_chunk(
            run_uid="bad", namespace="n\x00s", run_name="bad", chunk=chunk(0, b"x")
        )

    blockers = [insert(database, f"busy-{n}", 0, b"b") for n in range(4)]
    results = await asyncio.gather(
        *blockers,
        insert(database, "good-1", 0, b"g1"),
        bad(),
        insert(database, "good-2", 0, b"g2"),
        return_exceptions=True,
    )
    assert results[:5] == [None] * 5 and results[6] is None
    assert isinstance(results[5], asyncpg.PostgresError) and not isinstance(results[5], UNAVAILABLE)
    assert [c.payload for c in await database.read_chunks("good-2")] == [b"g2"]
    assert await database.read_chunks("bad") == []


async def test_a_run_that_stops_waiting_does_not_take_the_other_rows_of_its_statement_with_it(
    database: TranscriptDatabase,
) -> None:
    blockers = [asyncio.ensure_future(insert(database, f"busy-{n}", 0, b"b")) for n in range(4)]
    stopped = asyncio.ensure_future(insert(database, "stopped", 0, b"s"))
    kept = asyncio.ensure_future(insert(database, "kept", 0, b"k"))
    await asyncio.sleep(0)  # both queued behind the four on the wire
    stopped.cancel()
    assert await kept is None
    assert await asyncio.gather(*blockers) == [None] * 4
    assert stopped.cancelled()
    assert [c.payload for c in await database.read_chunks("kept")] == [b"k"]


async def test_with_the_database_down_every_row_of_a_statement_hears_that_it_is_unreachable(
    postgres: PostgresServer, database: TranscriptDatabase
) -> None:
    await postgres.stop()
    results = await asyncio.gather(
        *(insert(database, f"run-{n}", 0, b"x") for n in range(12)), return_exceptions=True
    )
    assert all(isinstance(r, UNAVAILABLE) for r in results), results
    await postgres.start()
    await postgres.wait_ready()
    assert await insert(database, "run-0", 0, b"x") is None
