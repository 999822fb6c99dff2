"""A thousand runs through one operator pod with the chart's default requests and limits.

The defaults in values.yaml are sized from what this measures (docs/install.md, "Sizing"): the pod's
peak memory against its limit, and its CPU, read from the pod's cgroup on the node's host (the real
node's kubelet uses cgroupfs on cgroup v1). The test asserts what must hold (every run succeeds, the
container is never OOM-killed or restarted, the peak stays under the limit) and prints the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import FINISHED, until
from tests.support.node import HOST_ADDRESS, Helm, Release, create_api_key_secret, release_values, restarts

API_KEY = "sk-ant-node-sizing-0123456789"
RUNS = 1000
CGROUP = Path("/sys/fs/cgroup")


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    script = Script(
        "[node:sizing]",
        [
            Reply(
                [tool_use_block("calculator", {"expression": "6*7"})],
                usage=ScriptUsage(400, 40, 0, 0),
                delay_seconds=0.5,
            ),
            Reply([text_block("42")], usage=ScriptUsage(450, 10, 0, 0), delay_seconds=0.5),
        ],
    )
    api = FakeMessagesAPI(scripts=[script], require_api_key=API_KEY)
    async with api.running(host=HOST_ADDRESS) as server:
        yield server


@dataclass
class PodUsage:
    """The pod's cgroup (cgroup v1, cgroupfs): peak memory as the kernel counts it, and CPU time."""

    memory: Path
    cpu: Path
    peak_rss: int = 0

    @classmethod
    def of(cls, pod_uid: str) -> PodUsage:
        found = sorted((CGROUP / "memory" / "kubepods").glob(f"**/pod{pod_uid}"))
        assert found, f"no cgroup of pod {pod_uid} under {CGROUP}/memory/kubepods: read on the node's host"
        relative = found[0].relative_to(CGROUP / "memory")
        return cls(found[0], CGROUP / "cpuacct" / relative)

    def read(self, name: str) -> int:
        return int((self.memory / name).read_text())

    def rss(self) -> int:
        stat = dict(line.split() for line in (self.memory / "memory.stat").read_text().splitlines())
        return int(stat["total_rss"])

    def cpu_seconds(self) -> float:
        return int((self.cpu / "cpuacct.usage").read_text()) / 1e9

    async def sample(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.peak_rss = max(self.peak_rss, self.rss())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("concurrent", [50, 500], ids=["default-concurrency", "500-at-once"])
async def test_a_thousand_runs_fit_the_default_requests_and_limits_without_an_oom_kill(
    cluster: TestCluster, helm: Helm, model: FakeMessagesAPI, concurrent: int
) -> None:
    """``concurrent``: operator.maxConcurrentRuns (50 is the chart's default): memory grows with it."""
    await create_api_key_secret(cluster, API_KEY)
    values = release_values(cluster, model.url, operator={"maxConcurrentRuns": concurrent})
    release = Release(cluster, helm, values, name="agentrun-operator-sizing")
    await release.install()
    try:
        [pod] = await release.wait_ready(1)
        usage = PodUsage.of(pod["metadata"]["uid"])
        limit = usage.read("memory.limit_in_bytes")
        assert limit == 1024**3, "the chart's default memory limit (1Gi)"
        cpu_before, started = usage.cpu_seconds(), time.monotonic()
        stop = asyncio.Event()
        sampler = asyncio.create_task(usage.sample(stop))
        try:
            await _create_runs(cluster, RUNS)
            finished = await _wait_finished(cluster, RUNS, timeout=1200)
        finally:
            stop.set()
            await sampler
        elapsed, cpu = time.monotonic() - started, usage.cpu_seconds() - cpu_before
        phases: dict[str, int] = {}
        for phase in finished:
            phases[phase] = phases.get(phase, 0) + 1
        assert phases == {"Succeeded": RUNS}, phases
        [after] = await release.pods()
        assert restarts(after) == 0, after["status"]["containerStatuses"]
        peak = usage.read("memory.max_usage_in_bytes")
        assert peak < limit
        print(
            f"\n{RUNS} runs (2 model requests each), {concurrent} at once, through one pod with the chart's "
            "default requests and limits: "
            f"{elapsed:.0f} s, CPU {cpu:.1f} s ({cpu / RUNS * 1000:.1f} ms per run), "
            f"peak memory {peak / 2**20:.0f} MiB (cgroup, page cache included), "
            f"peak RSS {usage.peak_rss / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB"
        )
    finally:
        await release.uninstall()


async def _create_runs(cluster: TestCluster, count: int) -> None:
    semaphore = asyncio.Semaphore(20)

    async def create(i: int) -> None:
        async with semaphore:
            manifest = agentrun(
                f"size-{i:04d}",
                f"[node:sizing] run {i}",
                namespace=cluster.namespace,
                model={"name": "claude-haiku-4-5"},
                tools=[{"builtin": {"name": "calculator"}}],
            )
            await cluster.request("POST", cluster.runs_path, json=manifest)

    await asyncio.gather(*(create(i) for i in range(count)))


async def _wait_finished(cluster: TestCluster, count: int, timeout: float) -> list[str]:
    phases: list[str] = []

    async def done() -> bool:
        nonlocal phases
        listed = await cluster.request("GET", cluster.runs_path)
        phases = [r.get("status", {}).get("phase", "") for r in listed["items"]]
        return len(phases) == count and all(p in FINISHED for p in phases)

    await until(done, f"{count} runs to finish", timeout)
    return phases
