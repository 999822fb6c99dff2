"""A real PostgreSQL server for tests and benchmarks: Debian's postgresql package, in a temporary directory.

`running_postgres(workdir)` starts one on a free 127.0.0.1 port (its socket in the directory too, so it
touches nothing of the machine's) and yields a `PostgresServer` whose `dsn` the operator and the plugin
are given; `stop()` and `start()` take it away and bring it back, as an outage does. initdb refuses to
run as root, so as root the server runs as the `postgres` user (the package creates it).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from tests.support.ports import free_port

USER = "agentrun"


def postgres_bin() -> Path:
    """The newest installed server's bin directory (scripts/install-tools.sh installs the package)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
    )
    if not found:
        raise RuntimeError(
            "no PostgreSQL server: install the Debian package postgresql (scripts/install-tools.sh)"
        )
    return Path(found[-1]).parent


async def _run(*argv: str) -> None:
    command = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({process.returncode}): {out.decode(errors='replace')}")


@dataclass(frozen=True)
class PostgresServer:
    directory: Path
    port: int
    #: Besides 127.0.0.1 (trusted), an address where pods reach this host: a password is asked there.
    remote_address: str | None = None
    password: str | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    @property
    def remote_dsn(self) -> str:
        """The DSN a pod is given: the remote address, with the password."""
        assert self.remote_address is not None and self.password is not None
        return f"postgresql://{USER}:{self.password}@{self.remote_address}:{self.port}/postgres"

    @property
    def listen_addresses(self) -> str:
        return ",".join(a for a in ("127.0.0.1", self.remote_address) if a)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    async def start(self) -> None:
        """Starts the server and returns once a real connection works."""
        options = (
            f"-p {self.port} -k {self.directory} -c listen_addresses={self.listen_addresses} -c fsync=off"
        )
        await _run(
            str(postgres_bin() / "pg_ctl"),
            "-D", str(self.data),
            "-l", str(self.directory / "server.log"),
            "-o", options,
            "-w",
            "start",
        )  # fmt: skip
        await self.wait_ready()

    async def stop(self) -> None:
        """Stops the server at once (connections are cut, as when a database goes away)."""
        await _run(str(postgres_bin() / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    async def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                connection = await asyncpg.connect(self.dsn, timeout=5)
                await connection.fetchval("SELECT 1")
                await connection.close()
                return
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def query(self, sql: str, *args: object) -> list[asyncpg.Record]:
        connection = await asyncpg.connect(self.dsn, timeout=5)
        try:
            return list(await connection.fetch(sql, *args))
        finally:
            await connection.close()


@asynccontextmanager
async def running_postgres(
    workdir: Path, *, remote_address: str | None = None, password: str | None = None
) -> AsyncIterator[PostgresServer]:
    """A fresh server in `workdir`/postgres-<port> (as root, a directory of its own under the system's
    temporary directory), removed afterwards; trust authentication as user `agentrun` on 127.0.0.1, and
    with `remote_address` also listening there, where the user's `password` is asked (scram-sha-256)."""
    port = free_port()
    if os.geteuid() == 0:
        # As `postgres`, the server must reach its directory: pytest's base directory is root's alone.
        directory = Path(tempfile.mkdtemp(prefix=f"agentrun-postgres-{port}-"))
        shutil.chown(directory, "postgres", "postgres")
    else:
        directory = Path(workdir) / f"postgres-{port}"
        directory.mkdir(parents=True)
    server = PostgresServer(directory, port, remote_address, password)
    await _run(
        str(postgres_bin() / "initdb"),
        "-D",
        str(server.data),
        "-U",
        USER,
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--no-sync",
    )
    if remote_address is not None:
        assert password is not None, "a server reachable from elsewhere asks a password there"
        with (server.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all {USER} 0.0.0.0/0 scram-sha-256\n")
    await server.start()
    try:
        if password is not None:
            await server.query(f"ALTER USER {USER} PASSWORD '{password}'")
        yield server
    finally:
        with contextlib.suppress(RuntimeError):  # already stopped: an outage test that did not start it
            await server.stop()
        shutil.rmtree(directory, ignore_errors=True)
