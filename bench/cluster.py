"""The Kubernetes side of the operator benchmarks: an emulator that timestamps and sizes every request,
and the real operator as a child process, sampled for memory and CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import kmock
import psutil  # type: ignore[import-untyped]  # no stubs in the dev group

from agentrun.api.status import FINISHED_PHASES
from agentrun_sandbox import operator_process
from agentrun_sandbox.kube import EmulatedCluster, KubeEmulator, RequestRecord

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "agentruns.agentrun.dev.yaml"
RUNS_PATH = "/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns"
BENCH_USER_AGENT = "agentrun-bench"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

#: Settings every operator process of this benchmark run gets (``--transcript-store``): the scale and
#: replica benchmarks build their processes in several places, and all of them must run the same store.
OPERATOR_SETTINGS: dict[str, str] = {}


@contextlib.contextmanager
def operator_settings(settings: Mapping[str, str]) -> Iterator[None]:
    """Every operator process started inside gets ``settings`` on top of its own environment."""
    saved = dict(OPERATOR_SETTINGS)
    OPERATOR_SETTINGS.update(settings)
    try:
        yield
    finally:
        OPERATOR_SETTINGS.clear()
        OPERATOR_SETTINGS.update(saved)


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
    """Adds arrival time and body size to every request, and notes when (and by whom: the bearer token, one
    per operator replica) a run's status turns terminal."""

    timed: list[TimedRequest] = attrs.field(factory=list)
    finished_at: dict[str, float] = attrs.field(factory=dict)
    finished_by: dict[str, str | None] = attrs.field(factory=dict)

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
                self.finished_by.setdefault(record.name, record.authorization)
        return record


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


@dataclass
class OperatorProcess(operator_process.OperatorProcess):
    """The shared operator process (:mod:`agentrun_sandbox.operator_process`), optionally under a profiler."""

    log_format: str = "json"
    die_with_parent: bool = True
    profile_path: Path | None = None
    """When set, the operator runs under cProfile and writes its stats here on exit."""

    def entry(self) -> tuple[str, ...]:
        if self.profile_path is None:
            return super().entry()
        return ("bench.profiled_operator", str(self.profile_path))

    def environment(self) -> dict[str, str]:
        env = super().environment()
        # bench/ is not installed: the profiled entry point is imported from the repository.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        return {**env, **OPERATOR_SETTINGS, **self.env}

    def start_profiling(self) -> None:
        """Profiled operators record from now on (see :mod:`bench.profiled_operator`)."""
        if self.profile_path is not None and self.process is not None:
            self.process.send_signal(signal.SIGUSR1)


@dataclass
class Stack:
    kube: EmulatedCluster
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
    async with EmulatedCluster.running(crd_paths=[CRD], emulator=emulator) as kube:
        operator = OperatorProcess(
            kubeconfig=Path(kube.kubeconfig_path),
            log_path=workdir / f"operator-{label}.log",
            env={"ANTHROPIC_API_KEY": api_key, "ANTHROPIC_BASE_URL": model_url, **(env or {})},
            args=("--max-concurrent-runs", str(max_concurrent_runs)),
            profile_path=profile_path,
        )
        async with running_operator(operator, stop_timeout=60.0 if profile_path else 3.0) as sampler:
            yield Stack(kube, emulator, operator, sampler)


@contextlib.asynccontextmanager
async def running_operator(
    operator: OperatorProcess, *, stop_timeout: float
) -> AsyncIterator[ProcessSampler]:
    """The operator started and sampled; stopped, sampler first, however the measurement ends."""
    await operator.start(ready_timeout=60.0)
    assert operator.process is not None
    sampler = ProcessSampler(operator.process.pid)
    sampler.start()
    try:
        yield sampler
    finally:
        await sampler.stop()
        await operator.stop(timeout=stop_timeout)


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
