"""Writing a quota's ledger: one writer per AgentRunQuota, many runs' changes in one write.

Why a read-modify-write of the whole status with its resourceVersion: the ledger is shared by every
operator process (restarts, replicas), and a merge patch cannot say "only if nobody else wrote in
between". A write that loses the race (409) is not retried as it was: the quota is read again and
every change of the batch applied again to what is there now, so the totals stay exact.

Why batches: a hundred runs reserving at once would otherwise be a hundred conflicting writes of
one object. Changes that arrive while a write is on the wire wait for it and go together in the
next one; each caller gets its change's result once the write that carries it has landed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIConflictError, APIGoneError, APINotFoundError
from agentrun.kube.retrying import DEFAULT_RETRY_POLICY, KubeRetryPolicy, retried
from agentrun.quotas.ledger import Ledger, QuotaDefinition

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: A change of one quota's ledger: applied to a fresh working copy, again after every conflict, so it
#: must depend on nothing but the ledger and the time it is given.
Change = Callable[[Ledger, dt.datetime], T]


class QuotaGone(Exception):
    """The quota was deleted: it limits nothing any more."""


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def newer(candidate: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether ``candidate`` is a later version of the object than ``current``.

    resourceVersions are opaque by contract but integers in every API server we know; when they are
    not, the candidate wins (a stale copy only costs one 409 and a re-read).
    """
    if current is None:
        return True
    new = (candidate.get("metadata") or {}).get("resourceVersion") or ""
    old = (current.get("metadata") or {}).get("resourceVersion") or ""
    if new.isdigit() and old.isdigit():
        return int(new) >= int(old)
    return True


def _unchanged(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> bool:
    """The same ledger, but for the window's start (which moves with the clock, not with a change)."""
    ignored = ("windowStart", "observedGeneration")
    old = {k: v for k, v in (before or {}).items() if k not in ignored}
    new = {k: v for k, v in after.items() if k not in ignored}
    return old == new


@dataclass
class _Pending(Generic[T]):
    change: Change[T]
    future: asyncio.Future[T]


class QuotaWriter:
    """The one writer of one quota's status in this process.

    ``latest()`` gives the newest copy of the object known (the watch's or our own last write's);
    ``written(obj)`` is told every copy this writer stored or read.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        *,
        latest: Callable[[], Mapping[str, Any] | None],
        written: Callable[[dict[str, Any]], None],
        retry: KubeRetryPolicy = DEFAULT_RETRY_POLICY,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self._kube = kube
        self._latest = latest
        self._written = written
        self._retry = retry
        self._clock = clock
        self._pending: list[_Pending[Any]] = []
        self._task: asyncio.Task[None] | None = None
        #: Writes that landed and conflicts met, for tests and logs.
        self.writes = 0
        self.conflicts = 0

    async def apply(self, change: Change[T]) -> T:
        """``change``'s result, once the write carrying it landed (at once when it changed nothing)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(change, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name=f"quota-writer:{self.namespace}/{self.name}")
        return await future

    async def _drain(self) -> None:
        # One turn of the event loop first: runs woken by the same quota change (a line admitted
        # together, lines.py) reach apply() in that turn and share this write.
        await asyncio.sleep(0)
        while self._pending:
            batch = [p for p in self._pending if not p.future.done()]  # a caller gone: not applied
            self._pending = []
            if not batch:
                continue
            try:
                outcomes = await self._write(batch)
            except Exception as exc:
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            for pending, (ok, value) in zip(batch, outcomes, strict=True):
                if pending.future.done():
                    continue
                if ok:
                    pending.future.set_result(value)
                else:
                    pending.future.set_exception(value)

    async def _write(self, batch: list[_Pending[Any]]) -> list[tuple[bool, Any]]:
        what = f"writing the ledger of AgentRunQuota {self.namespace}/{self.name}"
        current = self._latest()
        while True:
            if current is None:
                current = await self._read(what)
            now = self._clock()
            ledger = Ledger.load(QuotaDefinition.from_object(current), current.get("status"), now)
            outcomes: list[tuple[bool, Any]] = []
            for pending in batch:
                try:
                    outcomes.append((True, pending.change(ledger, now)))
                except Exception as exc:  # that caller's problem alone
                    outcomes.append((False, exc))
            metadata = current.get("metadata") or {}
            status = ledger.status(now, metadata.get("generation"))
            if _unchanged(current.get("status"), status):
                return outcomes
            body = {
                "apiVersion": current.get("apiVersion"),
                "kind": current.get("kind"),
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "uid": metadata.get("uid"),
                    "resourceVersion": metadata.get("resourceVersion"),
                },
                "spec": current.get("spec") or {},
                "status": status,
            }
            stored = await self._replace(body, what)
            if stored is None:
                self.conflicts += 1
                current = None  # read again, apply the whole batch again
                continue
            self.writes += 1
            self._written(stored)
            return outcomes

    async def _read(self, what: str) -> dict[str, Any]:
        try:
            obj = await retried(
                lambda: self._kube.get_quota(self.namespace, self.name), self._retry, what=what
            )
        except (APINotFoundError, APIGoneError) as exc:
            raise QuotaGone(f"AgentRunQuota {self.namespace}/{self.name} was deleted") from exc
        self._written(obj)
        return obj

    async def _replace(self, body: dict[str, Any], what: str) -> dict[str, Any] | None:
        """The stored object, or None when another writer got there first (409: re-read, re-apply)."""

        async def put() -> dict[str, Any] | None:
            try:
                return await self._kube.replace_quota_status(self.namespace, self.name, body)
            except APIConflictError as exc:
                if exc.retryable:  # 409 Conflict; AlreadyExists cannot happen on a PUT
                    return None
                raise

        try:
            return await retried(put, self._retry, what=what)
        except (APINotFoundError, APIGoneError) as exc:
            raise QuotaGone(f"AgentRunQuota {self.namespace}/{self.name} was deleted") from exc
