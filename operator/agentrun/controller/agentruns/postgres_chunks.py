"""A run's transcript chunks as rows of the PostgreSQL store (agentrun/stores/postgres.py).

Same guarantees as the Secret path of transcript_storing.py: a chunk is acknowledged to the loop only
once its row is committed, a retried insert of our own row is recognised by its bytes, and a read finds
every chunk the run's status counts or refuses to resume. What differs is an outage: the database not
answering is not a refusal, so the write waits (with backoff, for as long as it takes) while the run is
not being stopped, and the loop stays at its checkpoint meanwhile: no tool runs, nothing is lost or
repeated. The first failed attempt tells the run's status (`on_unavailable`), once per wait.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from agentrun.api.transcripts import POSTGRES_KIND, StoredChunk, TranscriptCorrupt, TranscriptError
from agentrun.controller.agentruns.run_control import RunControl
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.controller.agentruns.status_writing import StatusWriter
from agentrun.controller.agentruns.transcript_storing import (
    RunIdentity,
    StoreStopped,
    TranscriptConflict,
    TranscriptStore,
)
from agentrun.kube.calling import KubeClient
from agentrun.kube.retrying import KubeRetryPolicy
from agentrun.settings import Settings
from agentrun.stores.postgres import TABLE, UNAVAILABLE, TranscriptDatabase

logger = logging.getLogger(__name__)

T = TypeVar("T")


class PostgresChunks:
    """The `ChunkBackend` of one run in the PostgreSQL store."""

    kind = POSTGRES_KIND

    def __init__(
        self,
        database: TranscriptDatabase,
        run: RunIdentity,
        *,
        stopping: Callable[[], bool] = lambda: False,
        on_unavailable: Callable[[str], Awaitable[None]] | None = None,
        first_wait: float = 0.5,
        longest_wait: float = 10.0,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._db = database
        self._run = run
        self._stopping = stopping
        self._on_unavailable = on_unavailable
        self._first_wait = first_wait
        self._longest_wait = longest_wait
        self._sleep = sleep

    async def create(self, chunk: StoredChunk) -> None:
        run = self._run
        existing = await self._waiting(
            lambda: self._db.insert_chunk(
                run_uid=run.uid, namespace=run.namespace, run_name=run.name, chunk=chunk
            ),
            f"writing transcript chunk {chunk.index} of {run.namespace}/{run.name}",
        )
        if existing is not None and existing != chunk.payload:
            raise TranscriptConflict(
                f"transcript chunk {chunk.index} of {run.namespace}/{run.name} (uid {run.uid}) already "
                f"exists in {TABLE} with different content; is another operator instance running it?"
            )

    async def read(self, known: int) -> list[StoredChunk]:
        """The run's chunks from index 0 up to the first gap; a gap among the `known` ones is a hole."""
        run = self._run
        rows = await self._waiting(
            lambda: self._db.read_chunks(run.uid), f"reading the transcript of {run.namespace}/{run.name}"
        )
        chunks: list[StoredChunk] = []
        for index, row in enumerate(rows):
            if row.index != index:
                break
            chunks.append(row)
        if len(chunks) < known:
            raise TranscriptCorrupt(
                f"transcript chunk {len(chunks)} of {run.namespace}/{run.name} is missing from {TABLE}, "
                f"but the run's status counts {known} chunks"
            )
        return chunks

    async def _waiting(self, attempt: Callable[[], Awaitable[T]], what: str) -> T:
        """`attempt` until the database answers; a refusal (an SQL error) fails at once."""
        wait, told = self._first_wait, False
        while True:
            try:
                return await attempt()
            except UNAVAILABLE as exc:
                if self._stopping():
                    raise StoreStopped(
                        f"run {self._run.namespace}/{self._run.name} is stopping; {what} not done"
                    ) from exc
                message = f"the transcript database is unreachable ({_describe(exc)}); {what} waits for it"
                if not told:
                    told = True
                    logger.warning("%s", message)
                    await self._tell(message)
            except asyncpg.PostgresError as exc:
                raise TranscriptError(f"{what} failed: {_describe(exc)}") from exc
            await self._sleep(wait)
            wait = min(wait * 2, self._longest_wait)

    async def _tell(self, message: str) -> None:
        if self._on_unavailable is None:
            return
        try:
            await self._on_unavailable(message)
        except Exception as exc:  # the status is only the messenger: the wait goes on regardless
            logger.warning("could not write the transcript store's outage to status: %s", exc)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def run_transcript_store(
    settings: Settings,
    kube: KubeClient,
    database: TranscriptDatabase | None,
    ref: RunObject,
    control: RunControl,
    writer: StatusWriter,
) -> TranscriptStore:
    """The run's store: chunk objects, or rows of `database` when AGENTRUN_TRANSCRIPT_STORAGE=postgres
    (an outage then shows in the run's status through `writer`)."""
    run = RunIdentity(ref.namespace, ref.name, ref.uid)
    backend = None
    if settings.transcript_storage == "postgres":
        if database is None:
            raise TranscriptError("the PostgreSQL transcript store is configured but not connected")
        backend = PostgresChunks(
            database, run, stopping=control.silenced, on_unavailable=writer.store_unavailable
        )
    return TranscriptStore(
        kube,
        run,
        storage="configmap" if settings.transcript_storage == "configmap" else "secret",
        flush_after_seconds=settings.transcript_flush_seconds,
        stopping=control.silenced,
        retry=KubeRetryPolicy.from_settings(settings),
        backend=backend,
    )
