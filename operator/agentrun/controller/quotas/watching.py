"""The quotas of each namespace as this process knows them, and a signal when any of them changes.

Kopf's event handler for AgentRunQuotas (controller/kopf_registry.py) feeds :meth:`QuotaView.observe`;
the ledger writers feed it what they stored. Why a listing of its own on a namespace's first use:
Kopf's initial listing of quotas may come after the first runs want admission, and a run admitted
against an empty view would pass a quota it never saw.

Without the AgentRunQuota CRD the operator keeps working: Kopf warns once that it cannot serve the
resource, the listing here answers 404, and every namespace has no quotas (one warning, looked for
again now and then in case the CRD is installed later).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from agentrun.api import INSTALL_CRDS
from agentrun.controller.quotas.writing import newer
from agentrun.controller.snapshots import plain
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIError, APIForbiddenError, APINotFoundError
from agentrun.quotas.definitions import QuotaSpecError
from agentrun.quotas.ledger import QuotaDefinition
from agentrun.stores.postgres import UNAVAILABLE
from agentrun.stores.quota_ledgers import LedgerRow

logger = logging.getLogger(__name__)

CRD_MISSING = (
    "the AgentRunQuota CRD is not installed (or not readable here): runs are not limited by quotas; "
    f"install the CRDs with `{INSTALL_CRDS}`"
)
#: How long a namespace's listing that found no CRD holds before it is listed again.
RELIST_SECONDS = 60.0
#: A run waiting for admission, or a model request for room, looks again at least this often besides
#: the changes the view signals, in case a change came by no watch event it saw.
RECHECK_SECONDS = 30.0

Listener = Callable[[str, str, Mapping[str, Any] | None], None]
#: Reads the ledger rows of quotas by uid (AGENTRUN_QUOTA_LEDGER=postgres).
LoadLedgers = Callable[[list[str]], Awaitable[list[LedgerRow]]]


def recheck_after(room_at: dt.datetime | None, now: dt.datetime) -> float:
    """How long one waiting for room in a quota waits for a change before it looks again: until the
    room is due (``room_at``, half a second later), at most RECHECK_SECONDS."""
    if room_at is None:
        return RECHECK_SECONDS
    return min(RECHECK_SECONDS, max((room_at - now).total_seconds(), 0.0) + 0.5)


class QuotaView:
    def __init__(self, kube: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._kube = kube
        self._clock = clock
        self._objects: dict[str, dict[str, dict[str, Any]]] = {}  # namespace -> name -> object
        self._listed: dict[str, float | None] = {}  # namespace -> when a listing found no CRD, else None
        self._listing: dict[str, asyncio.Future[None]] = {}
        # Listings by number per namespace: started, the last that succeeded, and the namespaces whose
        # runs asked (mark) for one while one was out.
        self._started: dict[str, int] = {}
        self._completed: dict[str, int] = {}
        self._again: set[str] = set()
        self._changed = asyncio.Event()
        self._warned = False
        #: Told (namespace, name, object or None when deleted) of every change.
        self.listeners: list[Listener] = []
        # With the ledgers in PostgreSQL: each quota's row (by namespace and name), whose status stands
        # in for the object's (a copy of its totals); and how rows are read at a namespace's listing.
        self._rows: dict[tuple[str, str], LedgerRow] = {}
        self._changes: dict[str, int] = {}
        self._load_rows: LoadLedgers | None = None

    def keep_ledgers(self, load: LoadLedgers) -> None:
        """The ledgers are rows in PostgreSQL, read with ``load``: a quota shows its row's status."""
        self._load_rows = load

    def saw_row(self, row: LedgerRow) -> None:
        """A ledger row as read or written; an older version than known is ignored."""
        key = (row.namespace, row.name)
        known = self._rows.get(key)
        if known is not None and known.uid == row.uid and known.version >= row.version:
            return
        self._rows[key] = row
        obj = self.get(row.namespace, row.name)
        if obj is not None:
            self._notify(row.namespace, row.name, obj)

    def row_version(self, uid: str) -> int:
        """The version of the quota's ledger row known here (-1: none)."""
        return max((row.version for row in self._rows.values() if row.uid == uid), default=-1)

    def uids(self) -> list[str]:
        """The uids of every quota known."""
        return [str(o["metadata"].get("uid")) for objects in self._objects.values() for o in objects.values()]

    # What runs ask ------------------------------------------------------------------------------

    def changed(self) -> asyncio.Event:
        """Set at the next change of any quota: take it before looking, then wait on it."""
        return self._changed

    async def quotas(self, namespace: str) -> list[dict[str, Any]]:
        """The quotas of ``namespace`` by name, listed from the API server on first use."""
        await self._ensure_listed(namespace)
        return self.cached(namespace)

    def cached(self, namespace: str) -> list[dict[str, Any]]:
        objects = self._objects.get(namespace) or {}
        return [self._with_row(objects[name]) for name in sorted(objects)]

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj = (self._objects.get(namespace) or {}).get(name)
        return None if obj is None else self._with_row(obj)

    def _with_row(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The quota with its ledger row's status, when the ledgers are in PostgreSQL and it has one."""
        if self._load_rows is None:
            return obj
        metadata = obj["metadata"]
        row = self._rows.get((metadata.get("namespace") or "", metadata.get("name") or ""))
        if row is None or row.uid != metadata.get("uid"):
            return obj
        return {**obj, "status": row.status}

    def namespaces(self) -> list[str]:
        return sorted(ns for ns, objects in self._objects.items() if objects)

    # What feeds it ------------------------------------------------------------------------------

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of an AgentRunQuota (None: from the initial listing)."""
        metadata = body.get("metadata") or {}
        namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
        if not namespace or not name:
            return
        if event_type == "DELETED":
            self._rows.pop((namespace, name), None)
            if (self._objects.get(namespace) or {}).pop(name, None) is not None:
                self._notify(namespace, name, None)
            return
        self.update(plain(body))

    def update(self, obj: Mapping[str, Any]) -> None:
        """A copy of a quota (watched, read or written); older ones than what is known are ignored."""
        metadata = obj.get("metadata") or {}
        namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
        objects = self._objects.setdefault(namespace, {})
        if not newer(obj, objects.get(name)):
            return
        try:
            QuotaDefinition.from_object(obj)
        except QuotaSpecError as exc:  # the CRD's schema keeps these out; one that got in limits nothing
            logger.warning("ignoring AgentRunQuota %s/%s: %s", namespace, name, exc)
            if objects.pop(name, None) is not None:
                self._notify(namespace, name, None)
            return
        objects[name] = dict(obj)
        self._notify(namespace, name, self._with_row(objects[name]))

    def changes(self, namespace: str) -> int:
        """Counts the changes seen of the namespace's quotas (objects and ledger rows alike): what a
        decision worked out from them is valid for."""
        return self._changes.get(namespace, 0)

    def _notify(self, namespace: str, name: str, obj: Mapping[str, Any] | None) -> None:
        self._changes[namespace] = self._changes.get(namespace, 0) + 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for listener in self.listeners:
            try:
                listener(namespace, name, obj)
            except Exception:
                logger.exception("a listener of AgentRunQuota %s/%s failed", namespace, name)

    def mark(self, namespace: str) -> int:
        """Asks for a listing of ``namespace`` sent after now (one starts at once, or right after the
        one out); pass the mark to :meth:`fresh_quotas` to wait for it.

        Why: a quota created just before a run must bind it, and the quota's watch event may come after
        the run's (two watches keep no order between them). A new run takes its mark when it starts, so
        the listing goes on while it reads its transcript and Secrets; runs arriving together share one.
        """
        mark = self._started.get(namespace, 0)
        if not self._missing(namespace):
            out = self._listing.get(namespace)
            if out is None or out.done():
                self._start_listing(namespace)
            else:
                self._again.add(namespace)
        return mark

    async def fresh_quotas(self, namespace: str, after: int) -> list[dict[str, Any]]:
        """The quotas of ``namespace`` as a listing sent after :meth:`mark` returned ``after`` shows
        them. Where the last listing found no CRD, it holds as :meth:`quotas` says."""
        while not self._missing(namespace) and self._completed.get(namespace, 0) <= after:
            out = self._listing.get(namespace)
            await asyncio.shield(
                out if out is not None and not out.done() else self._start_listing(namespace)
            )
        return self.cached(namespace)

    def _missing(self, namespace: str) -> bool:
        """Whether a listing found no CRD lately (it is listed again after RELIST_SECONDS)."""
        since = self._listed.get(namespace)
        return since is not None and self._clock() - since < RELIST_SECONDS

    async def _ensure_listed(self, namespace: str) -> None:
        if namespace in self._listed and (self._listed[namespace] is None or self._missing(namespace)):
            return
        listing = self._listing.get(namespace)
        await asyncio.shield(listing if listing is not None else self._start_listing(namespace))

    def _start_listing(self, namespace: str) -> asyncio.Future[None]:
        number = self._started[namespace] = self._started.get(namespace, 0) + 1
        listing = asyncio.ensure_future(self._list_numbered(namespace, number))
        self._listing[namespace] = listing
        listing.add_done_callback(partial(self._listed_by, namespace))
        return listing

    async def _list_numbered(self, namespace: str, number: int) -> None:
        await self._list(namespace)
        self._completed[namespace] = max(self._completed.get(namespace, 0), number)

    def _listed_by(self, namespace: str, listing: asyncio.Future[None]) -> None:
        if self._listing.get(namespace) is not listing:  # a listing started since
            return
        del self._listing[namespace]
        if namespace in self._again:  # runs marked while it was out: one more, sent after them
            self._again.discard(namespace)
            self._start_listing(namespace)

    async def _list(self, namespace: str) -> None:
        try:
            items = await self._kube.list_quotas(namespace)
        except (APINotFoundError, APIForbiddenError) as exc:
            if not self._warned:
                logger.warning("%s (listing agentrunquotas in %s: %s)", CRD_MISSING, namespace, exc)
                self._warned = True
            self._listed[namespace] = self._clock()
            return
        except APIError as exc:
            # Not known: the run waits and asks again rather than pass a quota unseen.
            raise QuotaListingFailed(f"cannot list the AgentRunQuotas of {namespace}: {exc}") from exc
        for item in items:
            item.setdefault("apiVersion", "agentrun.dev/v1alpha1")
            item.setdefault("kind", "AgentRunQuota")
            item.setdefault("metadata", {}).setdefault("namespace", namespace)
            self.update(item)
        if self._load_rows is not None and items:
            try:
                rows = await self._load_rows([str(item["metadata"].get("uid")) for item in items])
            except UNAVAILABLE as exc:
                raise QuotaListingFailed(f"cannot read the quota ledgers of {namespace}: {exc}") from exc
            for row in rows:
                self.saw_row(row)
        self._listed[namespace] = None


class QuotaListingFailed(Exception):
    """The API server did not answer a listing of quotas (a transient failure: try again)."""
