"""The transcript stores a durability test runs against, each read back as a person would read it.

The guarantees after a SIGKILL (nothing lost, nothing repeated) are the store's as much as the loop's,
so the kill tests run once per store: Secrets read through the API server with a label-selected
listing, PostgreSQL rows read from a real server of the test's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from agentrun.api.transcripts import UID_LABEL, StoredChunk, Transcript, decode_chunks, decode_objects
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request
from tests.support.postgres import PostgresServer, running_postgres

StoreName = Literal["secret", "postgres"]
STORES: tuple[StoreName, ...] = ("secret", "postgres")
# A test marked with it runs once per store, its `transcript_store` fixture (tests/integration/conftest.py)
# the store of that run.
EACH_STORE = pytest.mark.parametrize("transcript_store", STORES, indirect=True)


@dataclass(frozen=True)
class StoreUnderTest:
    """One store: the operator settings that choose it, what status.transcript.kind then says, and its
    reader. `postgres` is the database server when the store is PostgreSQL."""

    name: StoreName
    status_kind: str
    cluster: TestCluster
    postgres: PostgresServer | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    async def transcript(self, uid: str) -> Transcript:
        if self.postgres is None:
            return await secret_transcript(self.cluster, uid)
        return await row_transcript(self.postgres, uid)


def secret_store(cluster: TestCluster) -> StoreUnderTest:
    return StoreUnderTest("secret", "Secret", cluster)


def postgres_store(cluster: TestCluster, server: PostgresServer) -> StoreUnderTest:
    env = {"AGENTRUN_TRANSCRIPT_STORAGE": "postgres", "AGENTRUN_DATABASE_URL": server.dsn}
    return StoreUnderTest("postgres", "postgres", cluster, server, env)


async def secrets_of(cluster: TestCluster, uid: str) -> list[dict[str, Any]]:
    """The run's chunk Secrets, as any client finds them: one label-selected listing through the API."""
    listed = await request(
        cluster, "GET", cluster.path("secrets"), params={"labelSelector": f"{UID_LABEL}={uid}"}
    )
    return [o for o in listed["items"] if o["metadata"].get("labels", {}).get(UID_LABEL) == uid]


async def secret_transcript(cluster: TestCluster, uid: str) -> Transcript:
    return decode_objects([{"kind": "Secret", **o} for o in await secrets_of(cluster, uid)])


async def rows_of(postgres: PostgresServer, uid: str) -> list[StoredChunk]:
    rows = await postgres.query(
        "SELECT idx, part, parts, payload FROM agentrun_transcript_chunks WHERE run_uid = $1 ORDER BY idx",
        uid,
    )
    return [StoredChunk(r["idx"], r["part"], r["parts"], bytes(r["payload"])) for r in rows]


async def row_transcript(postgres: PostgresServer, uid: str) -> Transcript:
    return decode_chunks(await rows_of(postgres, uid))


@asynccontextmanager
async def store_under_test(
    name: StoreName, cluster: TestCluster, workdir: Path
) -> AsyncIterator[StoreUnderTest]:
    """The store `name`; for PostgreSQL, a fresh server that lives as long as the context."""
    if name == "secret":
        yield secret_store(cluster)
        return
    async with running_postgres(workdir) as server:
        yield postgres_store(cluster, server)
