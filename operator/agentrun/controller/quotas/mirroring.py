"""A copy of each PostgreSQL ledger's totals in its quota's status, for people, kubectl and dashboards.

Why a copy and not the ledger: the lists of admitted runs and reservations are what grows with the runs,
and what bounded a quota object (docs/benchmarks.md). The copy keeps what `kubectl get agentrunquota`,
`kubectl agentrun quota` and the metrics read (used, reserved, summary, lost, refused, the window), the
counts of the lists, and the ledger's version it shows.

Why one writer per quota, late by a moment: the replica that looks after the quota (by its uid, as for
the first status and the cleaning, collecting.py) writes the newest version it has seen at most every
``MIRROR_SECONDS``, so a burst of reservations is one status write, and no two replicas' copies cross.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIError, APIGoneError, APINotFoundError
from agentrun.stores.quota_ledgers import LedgerRow

logger = logging.getLogger(__name__)

MIRROR_SECONDS = 0.5
#: The lists that stay in the ledger; the copy has their lengths in status.ledger.
LISTS = ("admitted", "reservations")


def ledger_copy(row: LedgerRow) -> dict[str, Any]:
    """The status that copies ``row``: its totals, the lists' lengths, and nulls that remove the lists
    a status written before the ledgers moved still holds (a merge patch)."""
    status: dict[str, Any] = {k: v for k, v in row.status.items() if k not in LISTS}
    status.update({name: None for name in LISTS})
    status["ledger"] = {
        "store": "postgres",
        "version": row.version,
        "admitted": len(row.status.get("admitted") or []),
        "reservations": len(row.status.get("reservations") or []),
    }
    return status


class LedgerMirror:
    def __init__(
        self,
        kube: KubeClient,
        owns: Callable[[str], bool],
        *,
        delay: float = MIRROR_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``owns(quota uid)``: whether this replica writes that quota's copy."""
        self._kube = kube
        self._owns = owns
        self._delay = delay
        self._sleep = sleep
        self._newest: dict[str, LedgerRow] = {}
        self._copied: dict[str, int] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Copies written, for tests and logs.
        self.writes = 0

    def saw(self, row: LedgerRow) -> None:
        """A version of a ledger (written here or elsewhere): copied soon, if this replica copies it."""
        if not row.uid or not self._owns(row.uid) or row.version <= self._copied.get(row.uid, 0):
            return
        known = self._newest.get(row.uid)
        if known is None or known.version < row.version:
            self._newest[row.uid] = row
        if row.uid not in self._tasks:
            task = asyncio.create_task(
                self._copy(row.uid), name=f"quota-ledger-copy:{row.namespace}/{row.name}"
            )
            self._tasks[row.uid] = task
            task.add_done_callback(lambda _: self._tasks.pop(row.uid, None))

    def pending(self) -> list[str]:
        """The quotas with a version seen and not copied yet."""
        return sorted(self._newest)

    def forget(self, uid: str) -> None:
        """The quota was deleted."""
        self._newest.pop(uid, None)
        self._copied.pop(uid, None)
        task = self._tasks.pop(uid, None)
        if task is not None:
            task.cancel()

    async def _copy(self, uid: str) -> None:
        while True:
            await self._sleep(self._delay)
            row = self._newest.pop(uid, None)
            if row is None or row.version <= self._copied.get(uid, 0):
                return
            try:
                await self._kube.patch_quota_status(row.namespace, row.name, ledger_copy(row))
            except (APINotFoundError, APIGoneError):
                return  # deleted meanwhile
            except APIError as exc:  # the next version (or this one, once more) is copied later
                logger.info(
                    "could not copy the ledger of AgentRunQuota %s/%s: %s", row.namespace, row.name, exc
                )
                known = self._newest.get(uid)
                if known is None or known.version < row.version:
                    self._newest[uid] = row
                continue
            self.writes += 1
            self._copied[uid] = row.version

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
