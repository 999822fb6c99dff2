"""Writing a quota's ledger in PostgreSQL (AGENTRUN_QUOTA_LEDGER=postgres): the same batches as
writing.py, applied in a transaction that locks the quota's row instead of a read-modify-write of its
status. Replicas writing at once wait for each other instead of losing a race and writing again.

The quota object still gives the ledger its definition (spec.hard, the window) and its uid, from the
watch as before; the status it gets is a copy of the ledger's totals (mirroring.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrun.controller.quotas.writing import QuotaWriter, _Pending, _unchanged, utc_now
from agentrun.kube.calling import KubeClient
from agentrun.kube.retrying import DEFAULT_RETRY_POLICY, KubeRetryPolicy
from agentrun.quotas.ledger import Ledger, QuotaDefinition
from agentrun.settings import Settings
from agentrun.stores.postgres import UNAVAILABLE, with_tables
from agentrun.stores.quota_ledgers import LedgerRow, QuotaLedgerDatabase, Status

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: While the database cannot be reached, a ledger change is tried again this often (the run waits).
OUTAGE_RETRY_SECONDS = 2.0


async def open_quota_ledgers(settings: Settings) -> QuotaLedgerDatabase | None:
    """Connected, with its table created; None unless AGENTRUN_QUOTA_LEDGER=postgres. A database not
    reachable at start is waited for: no run could be admitted or reserve without its ledger."""
    if settings.quota_ledger != "postgres" or settings.database_url is None:
        return None
    ledgers = await QuotaLedgerDatabase.connect(settings.database_url.get_secret_value())
    ledgers = await with_tables(ledgers, "quota ledger", retry_seconds=OUTAGE_RETRY_SECONDS)
    logger.info("quota ledgers are kept in PostgreSQL")
    return ledgers


@dataclass(frozen=True)
class _Kept:
    """The ledger as this writer last stored it (the row's ``version``), kept to skip reading and
    loading the row again when nobody else changed it: both take time in proportion to the runs."""

    version: int
    definition: QuotaDefinition
    ledger: Ledger
    status: Status


class DatabaseQuotaWriter(QuotaWriter):
    """The one writer of one quota's ledger row in this process (batches as QuotaWriter's)."""

    def __init__(
        self,
        kube: KubeClient,
        database: QuotaLedgerDatabase,
        namespace: str,
        name: str,
        *,
        latest: Callable[[], Mapping[str, Any] | None],
        written: Callable[[dict[str, Any]], None],
        stored: Callable[[LedgerRow], None],
        retry: KubeRetryPolicy = DEFAULT_RETRY_POLICY,
        clock: Callable[[], dt.datetime] = utc_now,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``latest``: the quota object as watched (its spec and uid); ``stored``: told every row this
        writer changed or read, for the view of the ledgers (watching.py)."""
        super().__init__(kube, namespace, name, latest=latest, written=written, retry=retry, clock=clock)
        self._database = database
        self._stored = stored
        self._sleep = sleep
        self._kept: _Kept | None = None

    async def _write(self, batch: list[_Pending[Any]]) -> list[tuple[bool, Any]]:
        what = f"writing the ledger of AgentRunQuota {self.namespace}/{self.name}"
        quota = self._latest() or await self._read(what)
        definition = QuotaDefinition.from_object(quota)
        metadata = quota.get("metadata") or {}
        outcomes: list[tuple[bool, Any]] = []
        # Usable once: a transaction tried again (after an outage) must not find the batch applied.
        unused = [self._kept] if self._kept is not None else []
        self._kept = None
        changed_ledger: list[Ledger] = []

        def apply(version: int, stored: Callable[[], Status | None]) -> Status | None:
            # Called once per transaction; a transaction tried again after an outage calls it again.
            now = self._clock()
            before: Status | None
            kept = unused.pop() if unused else None
            if kept is not None and kept.version == version and kept.definition == definition:
                ledger, before = kept.ledger, kept.status  # nobody changed it since this writer did
            else:
                before = stored()
                ledger = Ledger.load(definition, before, now)
            outcomes.clear()
            for pending in batch:
                try:
                    outcomes.append((True, pending.change(ledger, now)))
                except Exception as exc:  # that caller's problem alone
                    outcomes.append((False, exc))
            status = ledger.status(now, metadata.get("generation"))
            changed_ledger[:] = [ledger]
            return None if _unchanged(before, status) else status

        seed = {k: v for k, v in (quota.get("status") or {}).items() if k != "ledger"}
        row, changed = await self._reaching(
            lambda: self._database.change(
                str(metadata.get("uid") or ""), self.namespace, self.name, seed=seed or None, apply=apply
            )
        )
        if changed:
            self.writes += 1
        if changed_ledger:  # what it holds now is the row's version: the next batch starts from it
            self._kept = _Kept(row.version, definition, changed_ledger[0], row.status)
        self._stored(row)
        return outcomes

    async def _reaching(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt``'s result, waiting out an outage of the database: a run must not go on (or be
        admitted) with a ledger change that was not stored, nor be failed for an outage."""
        while True:
            try:
                return await attempt()
            except UNAVAILABLE as exc:
                logger.warning(
                    "the quota ledger database is unreachable (%s: %s); AgentRunQuota %s/%s waits, "
                    "trying again in %gs",
                    type(exc).__name__,
                    exc,
                    self.namespace,
                    self.name,
                    OUTAGE_RETRY_SECONDS,
                )
                await self._sleep(OUTAGE_RETRY_SECONDS)
