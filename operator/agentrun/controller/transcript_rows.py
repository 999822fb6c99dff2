"""The PostgreSQL transcript store's life beside the operator: its table, and removing rows of gone runs.

Why the operator deletes rows: chunk objects carry an ownerReference, so Kubernetes' garbage collector
removes them with their run (also after its TTL); rows have no owner the API server knows. AgentRuns have
no finalizer (a finalizer would make every deletion wait for an operator), so a run's rows go when its
DELETED watch event arrives, and a sweep at start and every `SWEEP_SECONDS` deletes the rows of runs
that no longer exist in the served namespaces (deleted while no operator watched), once they are older
than `GRACE_SECONDS`: a run created after the sweep listed the runs keeps its fresh rows.
"""

from __future__ import annotations

import asyncio
import logging

from agentrun.kube.calling import KubeClient
from agentrun.settings import Settings
from agentrun.stores.postgres import TranscriptDatabase, with_tables

logger = logging.getLogger(__name__)

SWEEP_SECONDS = 300.0
GRACE_SECONDS = 600.0
CONNECT_WAIT_SECONDS = 5.0


async def open_transcript_database(settings: Settings) -> TranscriptDatabase | None:
    """Connected, with its table created; None unless AGENTRUN_TRANSCRIPT_STORAGE=postgres.

    A database not reachable at start is waited for (logged): runs could not be resumed without it.
    """
    if settings.transcript_storage != "postgres" or settings.database_url is None:
        return None
    database = await TranscriptDatabase.connect(settings.database_url.get_secret_value())
    database = await with_tables(database, "transcript", retry_seconds=CONNECT_WAIT_SECONDS)
    logger.info("transcripts are stored in PostgreSQL")
    return database


class TranscriptRows:
    """Deletes the rows of runs that are gone: on their DELETED event, and by the periodic sweep."""

    def __init__(
        self,
        database: TranscriptDatabase,
        kube: KubeClient,
        namespaces: tuple[str, ...],
        *,
        sweep_seconds: float = SWEEP_SECONDS,
        grace_seconds: float = GRACE_SECONDS,
    ) -> None:
        self._db = database
        self._kube = kube
        self._namespaces = namespaces
        self._sweep_seconds = sweep_seconds
        self._grace_seconds = grace_seconds
        self._tasks: set[asyncio.Task[None]] = set()

    def deleted(self, uid: str) -> None:
        """A run's DELETED event: its rows go, in the background (the sweep catches a failure)."""

        async def deleting() -> None:
            try:
                rows = await self._db.delete_run(uid)
                logger.debug("deleted %d transcript rows of run %s", rows, uid)
            except Exception as exc:
                logger.warning(
                    "could not delete the transcript rows of run %s (the sweep will): %s", uid, exc
                )

        task = asyncio.get_running_loop().create_task(deleting())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def sweep(self) -> int:
        existing: set[str] = set()
        for namespace in self._namespaces or (None,):
            listing = await self._kube.list_runs(namespace)
            existing.update(item["metadata"]["uid"] for item in listing.get("items") or ())
        return await self._db.sweep(
            existing, namespaces=self._namespaces, older_than_seconds=self._grace_seconds
        )

    async def keep_sweeping(self) -> None:
        while True:
            try:
                swept = await self.sweep()
                if swept:
                    logger.info("deleted %d transcript rows of runs that no longer exist", swept)
            except Exception as exc:  # the next sweep tries again
                logger.warning("could not sweep the transcript rows of deleted runs: %s", exc)
            await asyncio.sleep(self._sweep_seconds)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
