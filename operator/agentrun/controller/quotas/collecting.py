"""Cleaning the ledgers of runs that are gone: deleted, or finished without releasing what they held.

A run releases its admission when it finishes, and settles each reservation after its answer. An
operator that was killed, or a run deleted while it waited, leaves entries behind that nobody else
will remove: an admission would hold a concurrentRuns place forever. So, on quota changes and now
and then, the runs named in the ledgers are looked up (one listing per namespace): a run that is
gone (or is a newer run of that name) or finished has its admission released and its reservations
charged in full (the API may have served them). Runs executing in this process are left alone.

With several replicas each quota is cleaned by one of them, the owner of the quota's uid
(controller/replicas/), so two replicas never race to charge the same lost reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from agentrun.api.status import FINISHED_PHASES
from agentrun.controller.quotas.watching import QuotaView
from agentrun.controller.quotas.writing import QuotaGone, utc_now
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIError
from agentrun.quotas.ledger import Ledger, QuotaDefinition

logger = logging.getLogger(__name__)

Write = Callable[[str, str, Callable[[Ledger, dt.datetime], Any]], Awaitable[Any]]

#: A pass at least this often, and at most this often when quotas keep changing.
COLLECT_SECONDS = 30.0
COLLECT_MIN_SECONDS = 5.0


async def collect(
    kube: KubeClient,
    view: QuotaView,
    write: Write,
    *,
    executing: Collection[str],
    owns: Callable[[str], bool] = lambda _uid: True,
    clock: Callable[[], dt.datetime] = utc_now,
) -> int:
    """One pass over every known quota this replica owns; returns how many runs' entries were cleaned up."""
    cleaned = 0
    now = clock()
    for namespace in view.namespaces():
        named: dict[str, set[str]] = {}
        for obj in view.cached(namespace):
            if not owns((obj.get("metadata") or {}).get("uid") or ""):
                continue
            ledger = Ledger.load(QuotaDefinition.from_object(obj), obj.get("status"), now)
            uids = ledger.uids() - set(executing)
            if uids:
                named[obj["metadata"]["name"]] = uids
        if not named:
            continue
        try:
            listing = await kube.list_runs(namespace)
        except APIError as exc:
            logger.warning("cannot list the AgentRuns of %s to clean quota ledgers: %s", namespace, exc)
            continue
        alive = {
            (item.get("metadata") or {}).get("uid")
            for item in listing.get("items") or []
            if (item.get("status") or {}).get("phase") not in FINISHED_PHASES
        }
        for quota, uids in named.items():
            gone = sorted(uids - alive)
            if not gone:
                continue
            with contextlib.suppress(QuotaGone):
                await write(namespace, quota, functools.partial(_forget, gone))
                cleaned += len(gone)
                logger.info(
                    "AgentRunQuota %s/%s: released what %d finished or deleted run(s) held",
                    namespace,
                    quota,
                    len(gone),
                )
    return cleaned


def _forget(uids: list[str], ledger: Ledger, now: dt.datetime) -> int:
    charged = 0
    for uid in uids:
        ledger.release(uid)
        charged += ledger.charge_lost(uid, keep_holder=None, now=now)
    return charged


async def keep_collecting(
    kube: KubeClient,
    view: QuotaView,
    write: Write,
    executing: Callable[[], Collection[str]],
    owns: Callable[[str], bool] = lambda _uid: True,
) -> None:
    """:func:`collect` after quota changes (at most every few seconds) and every half minute."""
    while True:
        changed = view.changed()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), COLLECT_SECONDS)
        await asyncio.sleep(COLLECT_MIN_SECONDS)
        try:
            await collect(kube, view, write, executing=executing(), owns=owns)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("cleaning the quota ledgers failed; trying again later")
