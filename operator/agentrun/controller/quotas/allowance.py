"""A run's allowance: what each of its model requests may spend, reserved in every quota first.

The loop (loop/requesting.py, loop/compacting.py) asks :meth:`RunAllowance.reserve` before each
model request for the most it can cost, and settles the ticket with the real usage afterwards. The
reservation is written before the request is sent, under a holder naming this operator process and
this execution of the run, so an execution that starts after a crash can tell its own reservations
from the ones nobody will ever settle, and charges those in full (:meth:`RunAllowance.start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentrun.api.usage import TokenUsage
from agentrun.controller.quotas.watching import QuotaView, recheck_after
from agentrun.controller.quotas.writing import QuotaGone, utc_now
from agentrun.kube.errors import APIError
from agentrun.kube.retrying import RetriesStopped
from agentrun.loop.errors import QuotaRefused
from agentrun.loop.protocols import Spend
from agentrun.metrics.definitions import Metrics
from agentrun.quotas.ledger import Blocked, Ledger, Reserved

logger = logging.getLogger(__name__)

Write = Callable[[str, str, Callable[[Ledger, dt.datetime], Any]], Awaitable[Any]]


def new_holder(identity: str) -> str:
    """One execution of one run in this process: "<identity>/<execution>", where the identity is the
    process's (Settings.replica_name: AGENTRUN_REPLICA_NAME, else POD_NAME, else host name and process id)
    and the execution's nonce tells apart two executions of one run in one process."""
    return f"{identity}/{secrets.token_hex(4)}"


@dataclass(frozen=True)
class ReservedRequest:
    """One model request reserved: its id in the ledgers, the quotas holding it, the most it may spend.
    The loop holds it as the opaque ticket of Allowance.reserve and hands it back to settle."""

    request_id: str
    quotas: tuple[str, ...]
    spend: Spend


class RunAllowance:
    """The loop's Allowance (loop/protocols.py) for one execution of one run."""

    def __init__(
        self,
        view: QuotaView,
        write: Write,
        metrics: Metrics,
        *,
        namespace: str,
        name: str,
        uid: str,
        holder: str,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self._view = view
        self._write = write
        self._metrics = metrics
        self._namespace = namespace
        self._name = name
        self._uid = uid
        self.holder = holder
        self._clock = clock
        self._ids = itertools.count(1)
        self._undoing: set[asyncio.Future[None]] = set()

    async def start(self) -> int:
        """Reservations of this run held by an earlier execution (its operator is gone) charged in full."""
        charged = 0
        for obj in self._view.cached(self._namespace):
            if not _reserved_in(obj, self._uid):
                continue
            quota = obj["metadata"]["name"]
            try:
                charged += await self._write(
                    self._namespace,
                    quota,
                    lambda ledger, now: ledger.charge_lost(self._uid, keep_holder=self.holder, now=now),
                )
            except QuotaGone:
                continue
        if charged:
            logger.warning(
                "charged %d reservation(s) of an earlier execution of %s/%s in full (its operator "
                "stopped before their answers were recorded)",
                charged,
                self._namespace,
                self._name,
            )
        return charged

    def active(self) -> bool:
        """A quota of the namespace is known (listed at admission, watched since)."""
        return bool(self._view.cached(self._namespace))

    async def reserve(self, spend: Spend) -> object:
        while True:
            changed = self._view.changed()
            request_id = f"{self.holder}/{next(self._ids)}"
            done: list[str] = []
            blocked: tuple[str, Blocked] | None = None
            for obj in self._view.cached(self._namespace):  # listed at admission, watched since
                quota = obj["metadata"]["name"]
                try:
                    verdict = await self._write(self._namespace, quota, self._reserving(request_id, spend))
                except QuotaGone:
                    continue
                except asyncio.CancelledError:
                    # Cancelled while it waits, it holds nothing: undone behind the write in flight.
                    self._undo_later([*done, quota], request_id)
                    raise
                if isinstance(verdict, Blocked):
                    blocked = (quota, verdict)
                    break
                done.append(quota)
            if blocked is None:
                return ReservedRequest(request_id, tuple(done), spend)
            for quota in done:  # undone: it was never sent
                await self._settle_in(quota, request_id, 0, Decimal(0))
            quota, verdict = blocked
            if verdict.final:
                self._metrics.quota_refused(self._namespace, quota, verdict.limit, "request")
                raise QuotaRefused(verdict.message)
            await self._wait(changed, verdict.room_at)

    def _reserving(
        self, request_id: str, spend: Spend
    ) -> Callable[[Ledger, dt.datetime], Reserved | Blocked]:
        def change(ledger: Ledger, now: dt.datetime) -> Reserved | Blocked:
            return ledger.reserve(
                self._uid, self._name, request_id, self.holder, spend.tokens, spend.cost_usd, now
            )

        return change

    def _undo_later(self, quotas: list[str], request_id: str) -> None:
        async def undo() -> None:
            for quota in quotas:
                await self._settle_in(quota, request_id, 0, Decimal(0))

        task = asyncio.ensure_future(undo())
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)

    async def settle(self, ticket: object, usage: TokenUsage | None, cost_usd: Decimal | None) -> None:
        """The real usage; None (the outcome is unknown: the API may have served it) charges in full."""
        if not isinstance(ticket, ReservedRequest):
            raise TypeError(f"not a request this allowance reserved: {ticket!r}")
        if usage is None:
            tokens, cost = ticket.spend.tokens, ticket.spend.cost_usd
        else:
            tokens, cost = usage.total, cost_usd
        for quota in ticket.quotas:
            await self._settle_in(quota, ticket.request_id, tokens, cost)

    async def _settle_in(self, quota: str, request_id: str, tokens: int, cost: Decimal | None) -> None:
        try:
            await self._write(
                self._namespace,
                quota,
                lambda ledger, now: ledger.settle(self._uid, request_id, tokens, cost, now),
            )
        except (QuotaGone, RetriesStopped):
            return
        except APIError as exc:
            # Left reserved: charged in full when the run next starts or is collected; never lost.
            logger.warning(
                "could not settle reservation %s in AgentRunQuota %s/%s (it stays charged in full): %s",
                request_id,
                self._namespace,
                quota,
                exc,
            )

    async def _wait(self, changed: asyncio.Event, room_at: dt.datetime | None) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), recheck_after(room_at, self._clock()))


def _reserved_in(obj: Mapping[str, Any], uid: str) -> bool:
    entries = (obj.get("status") or {}).get("reservations") or []
    return any(isinstance(entry, Mapping) and entry.get("uid") == uid for entry in entries)
