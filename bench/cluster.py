"""The Kubernetes side of the operator benchmarks: an emulator that timestamps and sizes every request,
and the real operator as a child process, sampled for memory and CPU.
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
from typing import Any

import aiohttp
import attrs
import kmock
import psutil  # type: ignore[import-untyped]  # no stubs in the dev group

from agentrun.api.status import FINISHED_PHASES
from agentrun.sandbox.kube_api import KubeAPI, KubeEmulator, RequestRecord

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
RUNS_PATH = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
BENCH_USER_AGENT = "agentrun-bench"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class TimedRequest:
    at: float
    """``time.time()`` when the emulator read the request."""
    record: RequestRecord
    size: int
    """Request body bytes."""
    from_bench: bool

    @property
    def is_write(self) -> bool:
        return self.record.method in WRITE_METHODS

    @property
    def kind(self) -> str:
        """A short label for breakdown tables, e.g. ``PATCH agentruns/status``."""
        r = self.record
        what = r.rbac_resource or r.path
        if r.method == "GET" and r.query.get("watch") in ("true", "1"):
            return f"WATCH {what}"
        if r.method == "GET" and r.name is None:
            return f"LIST {what}"
        return f"{r.method} {what}"


@attrs.define(kw_only=True)
class RecordingEmulator(KubeEmulator):
    """Adds arrival time and body size to every request, and notes when a run's status turns terminal."""

    timed: list[TimedRequest] = attrs.field(factory=list)
    finished_at: dict[str, float] = attrs.field(factory=dict)

    def _record(self, request: kmock.Request) -> RequestRecord:
        record = super()._record(request)
        now = time.time()
        body = request.body or b""
        self.timed.append(TimedRequest(now, record, len(body), record.user_agent == BENCH_USER_AGENT))
        if record.method == "PATCH" and record.subresource == "status" and record.name is not None:
            data = request.data
            status = data.get("status") if isinstance(data, Mapping) else None
            if isinstance(status, Mapping) and status.get("phase") in FINISHED_PHASES:
                self.finished_at.setdefault(record.name, now)
        return record


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ProcessSampler:
    """Peak RSS and CPU time of a process, sampled every ``interval`` seconds."""

    pid: int
    interval: float = 0.1
    peak_rss: int = 0
    _task: asyncio.Task[None] | None = None
    _process: psutil.Process | None = None

    def start(self) -> None:
        self._process = psutil.Process(self.pid)
        self._task = asyncio.ensure_future(self._sample())

    def cpu_seconds(self) -> float:
        assert self._process is not None
        times = self._process.cpu_times()
        return float(times.user + times.system)

    def rss(self) -> int:
        assert self._process is not None
        return int(self._process.memory_info().rss)

    async def _sample(self) -> None:
        with contextlib.suppress(psutil.Error):
            while True:
                self.peak_rss = max(self.peak_rss, self.rss())
                await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _die_with_parent() -> None:
    """Linux: SIGTERM the operator when the benchmark dies, so an interrupted run leaves no orphans."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class OperatorProcess:
    """``agentrun operator`` in a child process, started the way a Deployment would run it."""

    kubeconfig: Path
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    profile_path: Path | None = None
    """When set, the operator runs under cProfile and writes its stats here on exit."""
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None

    async def start(self, *, ready_timeout: float = 60.0) -> None:
        env = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("ANTHROPIC_", "AGENTRUN_", "KUBERNETES_"))
            },
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            **self.env,
        }
        with self.log_path.open("ab") as log:
            entry = (
                ("bench.profiled_operator", str(self.profile_path))
                if self.profile_path
                else ("agentrun.cli.main",)
            )
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                *entry,
                "operator",
                "--bind-address",
                "127.0.0.1",
                "--metrics-port",
                str(self.metrics_port),
                "--health-port",
                str(self.health_port),
                "--log-format",
                "json",
                *self.args,
                env=env,
                stdout=log,
                stderr=log,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + ready_timeout
        url = f"http://127.0.0.1:{self.health_port}/healthz"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    raise RuntimeError(f"operator exited with {self.process.returncode}; see {self.log_path}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"operator not healthy within {ready_timeout}s; see {self.log_path}")

    def start_profiling(self) -> None:
        """Profiled operators record from now on (see :mod:`bench.profiled_operator`)."""
        if self.profile_path is not None and self.process is not None:
            self.process.send_signal(signal.SIGUSR1)

    async def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM, then SIGKILL: the figures are taken by now, and Kopf's graceful shutdown takes seconds."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@dataclass
class Stack:
    kube: KubeAPI
    emulator: RecordingEmulator
    operator: OperatorProcess
    sampler: ProcessSampler


@contextlib.asynccontextmanager
async def running_stack(
    workdir: Path,
    *,
    model_url: str,
    api_key: str,
    max_concurrent_runs: int,
    label: str,
    profile_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """Emulator in this process, operator in a child process pointed at it and at the fake model."""
    emulator = RecordingEmulator(strict=False)
    async with KubeAPI.running(crd_paths=[CRD], emulator=emulator) as kube:
        operator = OperatorProcess(
            kubeconfig=Path(kube.kubeconfig_path),
            log_path=workdir / f"operator-{label}.log",
            env={"ANTHROPIC_API_KEY": api_key, "ANTHROPIC_BASE_URL": model_url, **(env or {})},
            args=("--max-concurrent-runs", str(max_concurrent_runs)),
            profile_path=profile_path,
        )
        await operator.start()
        assert operator.process is not None
        sampler = ProcessSampler(operator.process.pid)
        sampler.start()
        try:
            yield Stack(kube, emulator, operator, sampler)
        finally:
            await sampler.stop()
            await operator.stop(timeout=60.0 if profile_path else 3.0)


async def create_runs(
    url: str, manifests: list[dict[str, Any]], *, concurrency: int = 50
) -> dict[str, float]:
    """POST the manifests the way ``kubectl apply`` of many files would; returns name → creation time."""
    created: dict[str, float] = {}
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(headers={"User-Agent": BENCH_USER_AGENT}) as session:

        async def post(manifest: dict[str, Any]) -> None:
            async with gate, session.post(f"{url}{RUNS_PATH}", json=manifest) as response:
                if response.status >= 300:
                    raise RuntimeError(f"creating {manifest['metadata']['name']}: {await response.text()}")
                created[manifest["metadata"]["name"]] = time.time()

        await asyncio.gather(*(post(m) for m in manifests))
    return created


def agentrun_manifest(name: str, task: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"task": task, **spec},
    }
