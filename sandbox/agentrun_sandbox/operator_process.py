"""The real operator (`agentrun operator`) as a child process, the way a cluster would run it.

The one way the demo, the tests and the benchmarks start it: the same command line, environment and
shutdown, so a figure from the bench and a scenario in the tests are about the same process. It binds to
loopback on free ports and is stopped with SIGTERM (Kopf's graceful shutdown), then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

__all__ = ["OperatorProcess", "free_port", "running_operator"]

#: Variables of the caller's own shell that would change what the operator does (its settings, its model
#: credentials, an in-cluster configuration); a test or a benchmark passes the ones it means.
_CALLER_SETTINGS = ("ANTHROPIC_", "AGENTRUN_", "KUBERNETES_")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """Linux: SIGTERM the operator when its parent dies, so an interrupted run leaves no orphans."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    """Set on top of the environment; wins over everything else."""
    args: tuple[str, ...] = ()
    """Extra arguments after ``agentrun operator``'s own (e.g. ``--namespace``)."""
    log_format: str = "text"
    keep_environment: bool = False
    """Pass the caller's whole environment (the demo: a user's AGENTRUN_* settings apply); otherwise the
    caller's ANTHROPIC_*, AGENTRUN_* and KUBERNETES_* variables are left out."""
    die_with_parent: bool = False
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/healthz"

    def entry(self) -> tuple[str, ...]:
        """What follows ``python -m``: the operator's CLI (the bench runs it under a profiler instead)."""
        return ("agentrun.cli.main",)

    def environment(self) -> dict[str, str]:
        inherited = {
            k: v for k, v in os.environ.items() if self.keep_environment or not k.startswith(_CALLER_SETTINGS)
        }
        return {**inherited, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.env}

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            *self.entry(),
            "operator",
            "--bind-address",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--health-port",
            str(self.health_port),
            "--log-format",
            self.log_format,
            *self.args,
        ]

    async def start(self, *, ready_timeout: float | None = 30.0) -> None:
        """Start, then wait for ``/healthz`` (``ready_timeout=None``: do not wait)."""
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.command(),
                env=self.environment(),
                stdout=log,
                stderr=log,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        if ready_timeout is not None:
            try:
                await self._wait_healthy(self.process, ready_timeout)
            except BaseException:
                # Never healthy: nobody will stop it, so it is killed here (else it outlives the caller).
                await self.stop(kill=True)
                raise

    async def _wait_healthy(self, process: asyncio.subprocess.Process, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    raise RuntimeError(f"operator exited with {process.returncode}:\n{self.logs()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.health_url) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"operator not healthy within {timeout}s:\n{self.logs()}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def stop(self, *, kill: bool = False, timeout: float = 20.0) -> int:
        """SIGTERM (or SIGKILL with ``kill``); SIGKILL if it has not exited after ``timeout`` seconds."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            return proc.returncode if proc and proc.returncode is not None else 0
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            return await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            return await proc.wait()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def scrape(self) -> str:
        async with aiohttp.ClientSession() as session, session.get(self.metrics_url) as response:
            response.raise_for_status()
            return await response.text()


@contextlib.asynccontextmanager
async def running_operator(
    kubeconfig: Path,
    log_path: Path,
    env: Mapping[str, str],
    args: tuple[str, ...] = (),
    *,
    process_type: type[OperatorProcess] = OperatorProcess,
) -> AsyncIterator[OperatorProcess]:
    """The operator running for the block; ``process_type`` for subclasses that add to start or stop."""
    operator = process_type(kubeconfig=kubeconfig, log_path=log_path, env=env, args=args)
    await operator.start()
    try:
        yield operator
    finally:
        await operator.stop()
