"""The transcript store's connection pool against a real PostgreSQL server (tests/support/postgres.py)."""

from __future__ import annotations

from agentrun.api.transcripts import StoredChunk
from agentrun.stores.postgres import TABLE, TranscriptDatabase
from tests.support.postgres import PostgresServer


async def test_a_connection_goes_back_to_the_pool_without_a_reset_round_trip(
    postgres: PostgresServer,
) -> None:
    database = await TranscriptDatabase.connect(postgres.dsn, max_size=1)
    try:
        pool = database._pool
        await pool.execute("SET application_name = 'kept'")
        # asyncpg's default reset (RESET ALL among others) would have put the session back to its default.
        assert await pool.fetchval("SHOW application_name") == "kept"
    finally:
        await database.close()


async def test_a_transaction_left_open_is_still_rolled_back_when_its_connection_goes_back(
    postgres: PostgresServer,
) -> None:
    database = await TranscriptDatabase.connect(postgres.dsn, max_size=1)
    try:
        await database.ensure_schema()
        pool = database._pool
        async with pool.acquire() as connection:
            await connection.execute("BEGIN")
            await connection.execute(
                f"INSERT INTO {TABLE} (run_uid, idx, namespace, run_name, part, parts, payload)"
                " VALUES ('u', 0, 'ns', 'r', 0, 1, 'x')"
            )
        assert await database.read_chunks("u") == []
        assert (
            await database.insert_chunk(
                run_uid="u", namespace="ns", run_name="r", chunk=StoredChunk(0, 0, 1, b"y")
            )
            is None
        )
        assert [c.payload for c in await database.read_chunks("u")] == [b"y"]
    finally:
        await database.close()
