"""Several operator processes in one replica group, and a TCP link to the API server that can be cut.

Each replica calls the fake Messages API with an API key of its own, so the model's request log says
which replica asked; requests carry ``metadata.user_id`` = the run's uid, so it also says for which run.
A replica's API access is cut with :class:`CuttableLink`: it forwards bytes between the replica and the
API server until :meth:`CuttableLink.cut`, after which nothing more passes either way and new
connections hang (a partition, not a refusal: the replica's requests time out instead of failing fast).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yarl import URL

from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from tests.support.clusters import TestCluster
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import until

#: Short leases, so failover scenarios take seconds (the default is 15 s with renewals every 5 s).
LEASE_DURATION_SECONDS = 6
LEASE_RENEW_SECONDS = 1


class CuttableLink:
    """A TCP forwarder in front of the API server that can be cut (TLS passes through untouched)."""

    def __init__(self, upstream: str) -> None:
        url = URL(upstream)
        self._host, self._port = url.host or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.cut_at: float | None = None
        self.port = 0

    @property
    def is_cut(self) -> bool:
        return self.cut_at is not None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        """From now on nothing passes; connections stay open and silent."""
        self.cut_at = time.monotonic()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            if self.is_cut:
                await asyncio.Event().wait()  # a new connection into the partition: it hangs
            up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
            self._writers.add(up_writer)
            pumps = [
                asyncio.create_task(self._pump(reader, up_writer)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            self._tasks.update(pumps)
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                if self.is_cut:
                    await asyncio.Event().wait()  # drop it and everything after: a black hole
                writer.write(data)
                await writer.drain()
        if not self.is_cut:
            with contextlib.suppress(OSError):
                writer.close()

    def kubeconfig(self, cluster: TestCluster) -> Path:
        """The admin kubeconfig with its server reached through this link (paths made absolute)."""
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        for entry in config.get("clusters") or []:
            server = URL(entry["cluster"]["server"])
            entry["cluster"]["server"] = str(server.with_host("127.0.0.1").with_port(self.port))
        entries = [c["cluster"] for c in config.get("clusters") or []] + [
            u["user"] for u in config.get("users") or []
        ]
        for entry in entries:
            for key in ("certificate-authority", "client-certificate", "client-key", "tokenFile"):
                if entry.get(key):
                    entry[key] = str((cluster.kubeconfig.parent / entry[key]).resolve())
        path = cluster.workdir / f"link-{self.port}.kubeconfig"
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path


@dataclass
class Replica:
    name: str
    api_key: str
    process: OperatorProcess

    async def members(self) -> int | None:
        """How many live members this replica sees (its agentrun_replica_members gauge)."""
        try:
            text = await self.process.scrape()
        except Exception:
            return None
        found = re.search(
            rf'^agentrun_replica_members\{{replica="{re.escape(self.name)}"\}} (\S+)$', text, re.M
        )
        return int(float(found.group(1))) if found else None


@dataclass
class ReplicaGroup:
    """Operator processes sharing the runs of one namespace, under a group name unique to the test."""

    cluster: TestCluster
    model: FakeMessagesAPI
    workdir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    group: str = field(default_factory=lambda: f"t{secrets.token_hex(4)}")
    replicas: dict[str, Replica] = field(default_factory=dict)
    stopped: dict[str, Replica] = field(default_factory=dict)

    def _process(
        self, name: str, api_key: str, kubeconfig: Path | None, own_env: Mapping[str, str]
    ) -> OperatorProcess:
        env = {
            "ANTHROPIC_API_KEY": api_key,
            "ANTHROPIC_BASE_URL": self.model.url,
            "AGENTRUN_LEASE_NAMESPACE": self.cluster.namespace,
            "AGENTRUN_REPLICA_GROUP": self.group,
            "AGENTRUN_REPLICA_NAME": name,
            "AGENTRUN_LEASE_DURATION_SECONDS": str(LEASE_DURATION_SECONDS),
            "AGENTRUN_LEASE_RENEW_SECONDS": str(LEASE_RENEW_SECONDS),
            **self.env,
            **own_env,
        }
        log = self.workdir / f"operator-{name}.log"
        if kubeconfig is None:
            return self.cluster.operator_process(log, env)
        return self.cluster.operator_process_as(kubeconfig, log, env)

    async def start(
        self, name: str, *, kubeconfig: Path | None = None, env: Mapping[str, str] | None = None
    ) -> Replica:
        """``env``: settings of this replica alone, on top of the group's."""
        api_key = f"sk-ant-replica-{name}-{secrets.token_hex(8)}"
        replica = Replica(name, api_key, self._process(name, api_key, kubeconfig, env or {}))
        await replica.process.start(ready_timeout=60)
        if kubeconfig is not None:
            replica.process.kubeconfig = self.cluster.kubeconfig  # its evidence snapshot reads as admin
        self.replicas[name] = replica
        return replica

    async def stop(self, name: str, *, kill: bool = False) -> None:
        replica = self.replicas.pop(name)
        await replica.process.stop(kill=kill)
        self.stopped[name] = replica

    async def close(self) -> None:
        for name in list(self.replicas):
            await self.stop(name)

    async def wait_for_members(self, count: int, timeout: float = 60) -> None:
        """Until every running replica sees ``count`` live members."""

        async def seen() -> dict[str, int | None]:
            return {name: await replica.members() for name, replica in self.replicas.items()}

        await until(
            seen,
            f"every replica to see {count} members",
            timeout,
            done=lambda members: all(m == count for m in members.values()),
            every=0.2,
        )

    def replica_of(self, request: RecordedRequest) -> str:
        """Which replica sent a model request (by its API key: x-api-key, or a Bearer token)."""
        keys = {
            request.headers.get("x-api-key", ""),
            request.headers.get("authorization", "").removeprefix("Bearer "),
        }
        for replica in (*self.replicas.values(), *self.stopped.values()):
            if replica.api_key in keys:
                return replica.name
        raise AssertionError(f"a model request from no replica of the group: {request.request_id}")

    def logs(self) -> str:
        return "\n".join(r.process.logs() for r in (*self.replicas.values(), *self.stopped.values()))


@contextlib.asynccontextmanager
async def replica_group(
    cluster: TestCluster, model: FakeMessagesAPI, workdir: Path, env: Mapping[str, str] | None = None
) -> AsyncIterator[ReplicaGroup]:
    group = ReplicaGroup(cluster, model, workdir, dict(env or {}))
    try:
        yield group
    finally:
        await group.close()


@contextlib.asynccontextmanager
async def cuttable_link(cluster: TestCluster) -> AsyncIterator[CuttableLink]:
    link = CuttableLink(cluster.url)
    await link.start()
    try:
        yield link
    finally:
        await link.stop()
