"""The quotas part of the operator in one object: the view, one writer per quota, the gate, GC."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, TypeVar

from agentrun.controller.quotas import collecting
from agentrun.controller.quotas.admission import AdmissionGate
from agentrun.controller.quotas.allowance import RunAllowance, new_holder
from agentrun.controller.quotas.database_writing import DatabaseQuotaWriter
from agentrun.controller.quotas.mirroring import LedgerMirror
from agentrun.controller.quotas.watching import QuotaView
from agentrun.controller.quotas.writing import QuotaGone, QuotaWriter, utc_now
from agentrun.kube.calling import KubeClient
from agentrun.kube.retrying import DEFAULT_RETRY_POLICY, KubeRetryPolicy
from agentrun.metrics.definitions import Metrics
from agentrun.quotas.ledger import Ledger
from agentrun.stores.postgres import UNAVAILABLE
from agentrun.stores.quota_ledgers import LedgerRow, QuotaLedgerDatabase

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Quotas:
    def __init__(
        self,
        kube: KubeClient,
        metrics: Metrics,
        *,
        identity: str,
        retry: KubeRetryPolicy = DEFAULT_RETRY_POLICY,
        announce_interval: float = 10.0,
        clock: Callable[[], dt.datetime] = utc_now,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        ledgers: QuotaLedgerDatabase | None = None,
    ) -> None:
        """``identity``: this process (Settings.replica_name), the start of its reservations' holders.
        ``clock``: the time the ledgers are written and read at; ``sleep``: how admission waits to look
        again (both real but in tests). ``ledgers``: the ledgers are rows in PostgreSQL
        (AGENTRUN_QUOTA_LEDGER=postgres), the quotas' status a copy of their totals (mirroring.py)."""
        self.kube = kube
        self.metrics = metrics
        self.retry = retry
        self.identity = identity
        self.view = QuotaView(kube)
        self.view.listeners.append(self._publish)
        self.clock = clock
        self.gate = AdmissionGate(
            self.view, self.write, metrics, clock=clock, sleep=sleep, announce_interval=announce_interval
        )
        self._writers: dict[tuple[str, str], QuotaWriter] = {}
        #: Whether this replica looks after a quota (by uid), known once collecting starts; None: nobody.
        self._owns: Callable[[str], bool] | None = None
        self._first_writes: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.ledgers = ledgers
        self.mirror = LedgerMirror(kube, lambda uid: self._owns is None or self._owns(uid))
        self._reading: set[asyncio.Task[None]] = set()
        #: Quotas whose row is being read after a notification; True: read it once more after.
        self._reads: dict[str, bool] = {}
        if ledgers is not None:
            self.view.keep_ledgers(ledgers.read)

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event of an AgentRunQuota (Kopf's handler, controller/kopf_registry.py)."""
        self.view.observe(event_type, body)
        if event_type != "DELETED" and not body.get("status"):
            self._record_first(body)
        uid = str((body.get("metadata") or {}).get("uid") or "")
        if event_type == "DELETED" and self.ledgers is not None and uid:
            self.mirror.forget(uid)
            if self._owns is None or self._owns(uid):
                self._in_background(self.ledgers.delete(uid), f"quota-ledger-delete:{uid}")

    def _saw_row(self, row: LedgerRow) -> None:
        """A ledger row written here or read after a change elsewhere: the view, then its copy."""
        self.view.saw_row(row)
        self.mirror.saw(row)

    async def keep_listening(self, retry_seconds: float = 5.0) -> None:
        """With the ledgers in PostgreSQL: every change any replica commits is read again here at once,
        as the watch of a quota's status did; after a lost connection every ledger is read again."""
        assert self.ledgers is not None
        while True:
            lost = asyncio.Event()
            try:
                connection = await self.ledgers.listen(self._changed_elsewhere)
                connection.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for row in await self.ledgers.read(self.view.uids()):
                    self._saw_row(row)
            except UNAVAILABLE as exc:
                logger.warning(
                    "cannot listen for quota ledger changes (%s); retrying in %gs", exc, retry_seconds
                )
                await asyncio.sleep(retry_seconds)
                continue
            try:
                await lost.wait()
            finally:
                connection.terminate()
            logger.warning("lost the connection listening for quota ledger changes; reconnecting")

    def _changed_elsewhere(self, uid: str, version: int) -> None:
        """A change committed (by any replica): read unless this version is known already (our own
        writes are), and one read at a time per quota, again if more changes came meanwhile."""
        if self.view.row_version(uid) >= version:
            return
        if uid in self._reads:
            self._reads[uid] = True
            return
        self._reads[uid] = False
        assert self.ledgers is not None
        ledgers = self.ledgers

        async def read() -> None:
            try:
                while True:
                    for row in await ledgers.read([uid]):
                        self._saw_row(row)
                    if not self._reads.get(uid):
                        return
                    self._reads[uid] = False
            finally:
                self._reads.pop(uid, None)

        self._in_background(read(), f"quota-ledger-read:{uid}")

    def _in_background(self, work: Awaitable[None], name: str) -> None:
        async def doing() -> None:
            try:
                await work
            except Exception as exc:  # the next change reads it again; the listener's reconnect rereads all
                logger.info("%s failed: %s", name, exc)

        task = asyncio.create_task(doing(), name=name)
        self._reading.add(task)
        task.add_done_callback(self._reading.discard)

    def _record_first(self, body: Mapping[str, Any]) -> None:
        """A quota nobody has written a status for gets its empty ledger from the replica that looks
        after it, at once: `kubectl get arq` and `kubectl agentrun quota` then show zeros and the
        window instead of blank columns and "no usage recorded yet" until the first run."""
        metadata = body.get("metadata") or {}
        namespace, name, uid = metadata.get("namespace"), metadata.get("name"), metadata.get("uid")
        if not namespace or not name or self._owns is None or not self._owns(str(uid or "")):
            return
        key = (str(namespace), str(name))
        if key in self._first_writes:
            return
        task = asyncio.create_task(self._write_first(*key), name=f"quota-first-status:{namespace}/{name}")
        self._first_writes[key] = task
        task.add_done_callback(lambda _: self._first_writes.pop(key, None))

    async def _write_first(self, namespace: str, name: str) -> None:
        try:
            await self.write(namespace, name, lambda _ledger, _now: None)
        except QuotaGone:
            return
        except Exception as exc:  # an invalid spec (its own warning) or a server failure: the next run writes
            logger.info("could not write the first status of AgentRunQuota %s/%s: %s", namespace, name, exc)

    async def write(self, namespace: str, name: str, change: Callable[[Ledger, dt.datetime], T]) -> T:
        writer = self._writers.get((namespace, name))
        if writer is None and self.ledgers is not None:
            writer = DatabaseQuotaWriter(
                self.kube,
                self.ledgers,
                namespace,
                name,
                latest=lambda: self.view.get(namespace, name),
                written=self.view.update,
                stored=self._saw_row,
                retry=self.retry,
                clock=self.clock,
            )
            self._writers[(namespace, name)] = writer
        elif writer is None:
            writer = QuotaWriter(
                self.kube,
                namespace,
                name,
                latest=lambda: self.view.get(namespace, name),
                written=self.view.update,
                retry=self.retry,
                clock=self.clock,
            )
            self._writers[(namespace, name)] = writer
        return await writer.apply(change)

    def allowance(self, namespace: str, name: str, uid: str) -> RunAllowance:
        """The Allowance of one new execution of a run (its own holder)."""
        return RunAllowance(
            self.view,
            self.write,
            self.metrics,
            namespace=namespace,
            name=name,
            uid=uid,
            holder=new_holder(self.identity),
            clock=self.clock,
        )

    async def collect(
        self, executing: Collection[str], owns: Callable[[str], bool] = lambda _uid: True
    ) -> int:
        return await collecting.collect(self.kube, self.view, self.write, executing=executing, owns=owns)

    async def keep_collecting(
        self, executing: Callable[[], Collection[str]], owns: Callable[[str], bool] = lambda _uid: True
    ) -> None:
        """``owns(quota uid)``: whether this replica cleans that quota (all of them when alone), and
        writes the first status of a new one."""
        self._owns = owns
        await collecting.keep_collecting(self.kube, self.view, self.write, executing, owns)

    def _publish(self, namespace: str, name: str, obj: Mapping[str, Any] | None) -> None:
        if obj is None:
            self.metrics.forget_quota(namespace, name)
            self._writers.pop((namespace, name), None)
            return
        spec = obj.get("spec") or {}
        self.metrics.observe_quota(namespace, name, obj.get("status") or {}, hard=spec.get("hard") or {})
