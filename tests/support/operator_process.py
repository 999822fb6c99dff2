"""The real operator (`agentrun operator`) as a child process, the way a cluster would run it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.support import leaks
from tests.support.ports import free_port


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}/healthz"

    async def start(self, *, ready_timeout: float = 30.0) -> None:
        env = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("ANTHROPIC_", "AGENTRUN_", "KUBERNETES_"))
            },
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        log = self.log_path.open("ab")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentrun.cli.main",
            "operator",
            "--bind-address",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--health-port",
            str(self.health_port),
            "--log-format",
            "text",
            *self.args,
            env=env,
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + ready_timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    raise RuntimeError(f"operator exited with {self.process.returncode}:\n{self.logs()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(self.health_url) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"operator not healthy within {ready_timeout}s:\n{self.logs()}")

    async def stop(self, *, kill: bool = False, timeout: float = 20.0) -> int:
        proc = self.process
        if proc is None or proc.returncode is not None:
            return proc.returncode if proc and proc.returncode is not None else 0
        evidence = await self._keep_evidence()
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            return await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            return await proc.wait()
        finally:
            evidence.texts["operator log"] = self.logs()

    async def _keep_evidence(self) -> leaks.Evidence:
        """For the session's secret-leak scan (tests/test_secrets_never_leak.py)."""
        evidence = leaks.Evidence(source=str(self.log_path))
        key = self.env.get("ANTHROPIC_API_KEY")
        if key:
            evidence.secrets.add(key)
        with contextlib.suppress(aiohttp.ClientError, OSError):
            evidence.texts["metrics scrape"] = await self.scrape()
        with contextlib.suppress(aiohttp.ClientError, OSError, KeyError, IndexError):
            texts, secrets = await leaks.snapshot_cluster(self.kubeconfig)
            evidence.texts.update(texts)
            evidence.secrets.update(secrets)
        leaks.record(evidence)
        return evidence

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def scrape(self) -> str:
        async with aiohttp.ClientSession() as session, session.get(self.metrics_url) as response:
            response.raise_for_status()
            return await response.text()


@contextlib.asynccontextmanager
async def running_operator(
    kubeconfig: Path, log_path: Path, env: Mapping[str, str], args: tuple[str, ...] = ()
) -> AsyncIterator[OperatorProcess]:
    operator = OperatorProcess(kubeconfig=kubeconfig, log_path=log_path, env=env, args=args)
    await operator.start()
    try:
        yield operator
    finally:
        await operator.stop()
