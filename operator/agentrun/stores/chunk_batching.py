"""Transcript rows of many runs inserted together: one statement for all the rows waiting at that moment.

Why: at 1000 runs every iteration of every run inserts one row, and each INSERT on its own costs the
operator about 0.2 ms of CPU (asyncpg's pool, protocol and statement layers) and the server a
transaction; in one statement of 50 rows a row costs about 0.01 ms (issue #32, docs/benchmarks.md).
Nothing waits to fill a batch: a row goes out at once when fewer than `max_in_flight` statements are
on the wire, and rows that arrive while they are all busy go together in the next one. So a lone row
is as quick as before, and under load the batches grow by themselves (group commit).

Each caller still learns what became of its own row: inserted, or the payload of the row already at its
index (a conflict). A statement the server refuses is tried again row by row, so a row the database
rejects fails only its own run; when the database cannot be reached, every row of the statement gets
that error and its run waits and retries as before (controller/agentruns/postgres_chunks.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg

from agentrun.api.transcripts import StoredChunk

#: Rows and payload bytes of one statement at most: a bounded message to the server.
MAX_ROWS = 256
MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ChunkRow:
    run_uid: str
    namespace: str
    run_name: str
    chunk: StoredChunk

    @property
    def key(self) -> tuple[str, int]:
        return self.run_uid, self.chunk.index


class Rows(Protocol):
    """The pool as the batcher needs it (asyncpg.Pool)."""

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...


def _future() -> asyncio.Future[bytes | None]:
    return asyncio.get_running_loop().create_future()


@dataclass
class _Waiting:
    row: ChunkRow
    answer: asyncio.Future[bytes | None] = field(default_factory=_future)


class ChunkBatcher:
    """Inserts rows given one at a time in as few statements as the load allows.

    `insert_one` is the single-row insert (its answer as `insert`'s), used when a whole statement is
    refused, to find the row at fault; `unavailable`: the errors that mean the database cannot be
    reached, which every row of the statement hears as they are.
    """

    def __init__(
        self,
        rows: Rows,
        table: str,
        insert_one: Callable[[ChunkRow], Awaitable[bytes | None]],
        *,
        unavailable: tuple[type[BaseException], ...],
        max_in_flight: int = 4,
    ) -> None:
        self._rows = rows
        self._unavailable = unavailable
        self._insert_one = insert_one
        self._max_in_flight = max_in_flight
        self._queue: list[_Waiting] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._insert = (
            f"INSERT INTO {table} (run_uid, idx, namespace, run_name, part, parts, payload) "
            "SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::text[], $5::int[], $6::int[], "
            "$7::bytea[]) ON CONFLICT (run_uid, idx) DO NOTHING RETURNING run_uid, idx"
        )
        self._existing = (
            f"SELECT run_uid, idx, payload FROM {table} "
            "WHERE (run_uid, idx) IN (SELECT * FROM unnest($1::text[], $2::int[]))"
        )
        self.statements = 0  # sent so far: the tests see the rows go together

    async def insert(self, row: ChunkRow) -> bytes | None:
        """None when the row was inserted, else the payload of the row already at its index."""
        waiting = _Waiting(row)
        self._queue.append(waiting)
        self._send_some()
        # Shielded: a run stopped while its row is on the wire does not cancel the other runs' rows.
        return await asyncio.shield(waiting.answer)

    def _send_some(self) -> None:
        while self._queue and len(self._in_flight) < self._max_in_flight:
            batch = self._take()
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._send_some()

    def _take(self) -> list[_Waiting]:
        taken, size = 0, 0
        for waiting in self._queue:
            size += len(waiting.row.chunk.payload)
            if taken and (taken >= MAX_ROWS or size > MAX_BYTES):
                break
            taken += 1
        batch, self._queue = self._queue[:taken], self._queue[taken:]
        return batch

    async def _send(self, batch: list[_Waiting]) -> None:
        try:
            answers = await self._answers([w.row for w in batch])
        except asyncpg.PostgresError as exc:
            if len(batch) == 1 or isinstance(exc, self._unavailable):
                _settle(batch, exc)
                return
            await asyncio.gather(*(self._alone(waiting) for waiting in batch))
            return
        except BaseException as exc:  # unreachable (or the operator stopping): every row hears it
            _settle(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for waiting, answer in zip(batch, answers, strict=True):
            if not waiting.answer.done():
                waiting.answer.set_result(answer)

    async def _answers(self, rows: Sequence[ChunkRow]) -> list[bytes | None]:
        self.statements += 1
        inserted = await self._rows.fetch(
            self._insert,
            [r.run_uid for r in rows],
            [r.chunk.index for r in rows],
            [r.namespace for r in rows],
            [r.run_name for r in rows],
            [r.chunk.part for r in rows],
            [r.chunk.parts for r in rows],
            [r.chunk.payload for r in rows],
        )
        new = {(record["run_uid"], record["idx"]) for record in inserted}
        conflicts = [r for r in rows if r.key not in new]
        found: dict[tuple[str, int], bytes] = {}
        if conflicts:  # rare: a resumed run writing again what it wrote before it was stopped
            records = await self._rows.fetch(
                self._existing, [r.run_uid for r in conflicts], [r.chunk.index for r in conflicts]
            )
            found = {(rec["run_uid"], rec["idx"]): bytes(rec["payload"]) for rec in records}
        answers: list[bytes | None] = []
        for r in rows:
            if r.key in new and r.key not in found:
                answers.append(None)
                found[r.key] = r.chunk.payload  # a key twice in one statement: the second finds the first
            else:
                answers.append(found.get(r.key, b""))
        return answers

    async def _alone(self, waiting: _Waiting) -> None:
        try:
            answer = await self._insert_one(waiting.row)
        except BaseException as exc:
            _settle([waiting], exc)
            if not isinstance(exc, Exception):
                raise
            return
        if not waiting.answer.done():
            waiting.answer.set_result(answer)

    async def close(self) -> None:
        """Waits for the statements on the wire (their rows' runs are told)."""
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)


def _settle(batch: Sequence[_Waiting], exc: BaseException) -> None:
    """Every row of `batch` fails with `exc` (cancelled, when the operator is stopping)."""
    for waiting in batch:
        if waiting.answer.done():
            continue
        if isinstance(exc, Exception):
            waiting.answer.set_exception(exc)
            waiting.answer.exception()  # its run may have stopped waiting: no "never retrieved" warning
        else:
            waiting.answer.cancel()
