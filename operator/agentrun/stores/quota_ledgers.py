"""Quota ledgers in PostgreSQL: one row per AgentRunQuota, changed in a transaction that locks it.

Why: in the quota's status the ledger lists every admitted run and every reservation in flight, so one
object holds about 6,600 running runs before etcd's request limit (docs/benchmarks.md), and replicas
changing it at once lose races (409) and write it again. A row has no such bound, and ``SELECT ... FOR
UPDATE`` makes concurrent writers wait their turn instead of failing. The row holds exactly what the
status held (the same JSON, written by the same Ledger), so nothing about accounting changes; the
quota's status becomes a copy of its totals (controller/quotas/mirroring.py).

Every change notifies the channel with the quota's uid, so every replica reads the row again at once:
what the watch of the quota's status did for the ledger in it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

TABLE = "agentrun_quota_ledgers"
CHANNEL = "agentrun_quota_ledgers"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    quota_uid text PRIMARY KEY,
    namespace text NOT NULL,
    name text NOT NULL,
    version bigint NOT NULL,
    status text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""

Status = dict[str, Any]


@dataclass(frozen=True)
class LedgerRow:
    """One quota's ledger as stored: ``version`` counts its changes (0: seeded, never changed)."""

    uid: str
    namespace: str
    name: str
    version: int
    status: Status


class QuotaLedgerDatabase:
    """A small connection pool for the ledgers, and a connection of its own for the notifications."""

    def __init__(self, pool: Any, dsn: str) -> None:
        self._pool = pool
        self._dsn = dsn

    @classmethod
    async def connect(cls, dsn: str, *, max_size: int = 4, timeout: float = 10.0) -> QuotaLedgerDatabase:
        pool = await asyncpg.create_pool(
            dsn, min_size=0, max_size=max_size, timeout=timeout, command_timeout=timeout
        )
        return cls(pool, dsn)

    async def close(self) -> None:
        await self._pool.close()

    async def ensure_schema(self) -> None:
        await self._pool.execute(SCHEMA)

    async def change(
        self,
        uid: str,
        namespace: str,
        name: str,
        *,
        seed: Mapping[str, Any] | None,
        apply: Callable[[int, Callable[[], Status | None]], Status | None],
    ) -> tuple[LedgerRow, bool]:
        """The row after ``apply`` and whether it changed. ``apply(version, stored)`` gets the stored
        version and a reader of the stored status (None when empty; parsed only if called: a writer
        that knows that version already need not), and returns the new status (None: unchanged). A
        quota without a row gets one holding ``seed`` first (the ledger its status held before the
        ledgers moved here); the row stays locked until the commit."""
        async with self._pool.acquire() as connection, connection.transaction():
            await connection.execute(
                f"INSERT INTO {TABLE} (quota_uid, namespace, name, version, status) "
                "VALUES ($1, $2, $3, 0, $4) ON CONFLICT (quota_uid) DO NOTHING",
                uid,
                namespace,
                name,
                json.dumps(dict(seed or {})),
            )
            row = await connection.fetchrow(
                f"SELECT version, status FROM {TABLE} WHERE quota_uid = $1 FOR UPDATE", uid
            )
            version = int(row["version"])
            parsed: list[Status] = []

            def stored() -> Status | None:
                if not parsed:
                    parsed.append(json.loads(row["status"]))
                return parsed[0] or None

            changed = apply(version, stored)
            if changed is None:
                return LedgerRow(uid, namespace, name, version, stored() or {}), False
            version += 1
            await connection.execute(
                f"UPDATE {TABLE} SET version = $2, status = $3, updated_at = now() WHERE quota_uid = $1",
                uid,
                version,
                json.dumps(changed, separators=(",", ":")),
            )
            # Delivered at the commit, to every replica listening (this one too): "<uid> <version>".
            await connection.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{uid} {version}")
            return LedgerRow(uid, namespace, name, version, changed), True

    async def read(self, uids: Collection[str]) -> list[LedgerRow]:
        rows = await self._pool.fetch(
            f"SELECT quota_uid, namespace, name, version, status FROM {TABLE} "
            "WHERE quota_uid = ANY($1::text[])",
            list(uids),
        )
        return [
            LedgerRow(r["quota_uid"], r["namespace"], r["name"], int(r["version"]), json.loads(r["status"]))
            for r in rows
        ]

    async def delete(self, uid: str) -> None:
        await self._pool.execute(f"DELETE FROM {TABLE} WHERE quota_uid = $1", uid)

    async def listen(self, changed: Callable[[str, int], None]) -> Any:
        """A connection that calls ``changed(uid, version)`` for every committed change; the caller closes
        it (and listens again after it was lost: changes meanwhile were not told)."""

        def notified(_connection: Any, _pid: int, _channel: str, payload: str) -> None:
            uid, _, version = payload.partition(" ")
            changed(uid, int(version) if version.isdigit() else 0)

        connection = await asyncpg.connect(self._dsn)
        await connection.add_listener(CHANNEL, notified)
        return connection
