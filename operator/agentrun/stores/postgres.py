"""The PostgreSQL transcript store's table: one row per chunk, holding what a chunk object's data holds.

Why a database: with Secrets every transcript write is an etcd write, and etcd holds every chunk of every
run kept; Argo and Tekton users moved exactly this kind of data to PostgreSQL. The record format is
unchanged (`agentrun.api.transcripts`: the same compressed, split records), so one decoder reads both
stores and a row's ``payload`` is byte for byte the data of the chunk object it replaces.

Used by the operator (controller/agentruns/postgres_chunks.py writes and reads through it, the sweep
deletes) and by ``kubectl agentrun transcript|trace``, which read the rows of one run uid.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Any, Protocol, TypeVar

import asyncpg

from agentrun.api.transcripts import StoredChunk
from agentrun.stores.chunk_batching import ChunkBatcher, ChunkRow

logger = logging.getLogger(__name__)

TABLE = "agentrun_transcript_chunks"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    run_uid text NOT NULL,
    idx int NOT NULL,
    namespace text NOT NULL,
    run_name text NOT NULL,
    part int NOT NULL,
    parts int NOT NULL,
    payload bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_uid, idx)
)
"""

# The database cannot be reached (down, restarting, network): worth waiting for, unlike a refused query.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)


class _Tables(Protocol):
    async def ensure_schema(self) -> None: ...

    async def close(self) -> None: ...


Tables = TypeVar("Tables", bound=_Tables)


async def with_tables(database: Tables, what: str, *, retry_seconds: float) -> Tables:
    """``database`` once its tables exist. A database not reachable at start is waited for (logged):
    what it holds is needed before any run goes on; on any other failure it is closed."""
    while True:
        try:
            await database.ensure_schema()
        except UNAVAILABLE as exc:
            logger.warning(
                "the %s database is unreachable (%s: %s); retrying in %gs",
                what,
                type(exc).__name__,
                exc,
                retry_seconds,
            )
            await asyncio.sleep(retry_seconds)
            continue
        except BaseException:
            await database.close()
            raise
        return database


async def keep_session(connection: Any) -> None:
    """Given back to the pool as it is: the store sets no session state (no LISTEN, SET, advisory lock or
    cursor), and asyncpg still rolls back a transaction left open. asyncpg's default reset is one more
    round trip per query: a fifth of the operator's CPU spent on the store at 1000 runs (issue #32)."""


class TranscriptDatabase:
    """A connection pool to the store's database; connections are made as needed, so an outage at one
    moment fails that moment's queries and the next ones reconnect."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._batcher = ChunkBatcher(pool, TABLE, self._insert_one, unavailable=UNAVAILABLE)

    @classmethod
    async def connect(cls, dsn: str, *, max_size: int = 10, timeout: float = 10.0) -> TranscriptDatabase:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=0,
            max_size=max_size,
            timeout=timeout,
            command_timeout=timeout,
            reset=keep_session,
        )
        return cls(pool)

    async def close(self) -> None:
        await self._batcher.close()
        await self._pool.close()

    async def ensure_schema(self) -> None:
        await self._pool.execute(SCHEMA)

    async def insert_chunk(
        self, *, run_uid: str, namespace: str, run_name: str, chunk: StoredChunk
    ) -> bytes | None:
        """Inserts the chunk; None when inserted, else the payload of the row already at its index.

        Rows of runs writing at the same moment go in one statement (stores/chunk_batching.py).
        """
        return await self._batcher.insert(ChunkRow(run_uid, namespace, run_name, chunk))

    async def _insert_one(self, row: ChunkRow) -> bytes | None:
        """One row alone. No transaction around the two statements: the insert is atomic by itself,
        and a row is never updated, so the one found after a conflict is the one that caused it."""
        status = await self._pool.execute(
            f"INSERT INTO {TABLE} (run_uid, idx, namespace, run_name, part, parts, payload) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_uid, idx) DO NOTHING",
            row.run_uid,
            row.chunk.index,
            row.namespace,
            row.run_name,
            row.chunk.part,
            row.chunk.parts,
            row.chunk.payload,
        )
        if status.endswith(" 1"):
            return None
        existing = await self._pool.fetchval(
            f"SELECT payload FROM {TABLE} WHERE run_uid = $1 AND idx = $2", row.run_uid, row.chunk.index
        )
        return bytes(existing) if existing is not None else b""

    async def read_chunks(self, run_uid: str) -> list[StoredChunk]:
        rows = await self._pool.fetch(
            f"SELECT idx, part, parts, payload FROM {TABLE} WHERE run_uid = $1 ORDER BY idx", run_uid
        )
        return [StoredChunk(r["idx"], r["part"], r["parts"], bytes(r["payload"])) for r in rows]

    async def delete_run(self, run_uid: str) -> int:
        status = await self._pool.execute(f"DELETE FROM {TABLE} WHERE run_uid = $1", run_uid)
        return int(str(status).rsplit(" ", 1)[-1])

    async def sweep(
        self, existing: Collection[str], *, namespaces: Collection[str], older_than_seconds: float
    ) -> int:
        """Deletes the rows of runs not in `existing` (uids), in `namespaces` (empty: all), written more
        than `older_than_seconds` ago: a run created since the listing keeps its rows."""
        status = await self._pool.execute(
            f"DELETE FROM {TABLE} WHERE NOT (run_uid = ANY($1::text[])) "
            "AND (cardinality($2::text[]) = 0 OR namespace = ANY($2::text[])) "
            "AND created_at < now() - make_interval(secs => $3)",
            list(existing),
            list(namespaces),
            float(older_than_seconds),
        )
        return int(str(status).rsplit(" ", 1)[-1])
