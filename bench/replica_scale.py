"""Benchmark 6: N concurrent AgentRuns shared by 1, 2 and 4 operator replicas, separate processes.

The same runs as the scale benchmark (5 model requests each, 1 s model latency; ideal finish 5 s after the
first creation), served by R ``agentrun operator`` processes that share one replica group: each has
AGENTRUN_LEASE_NAMESPACE set to the benchmark namespace, its own AGENTRUN_REPLICA_NAME, metrics port and
bearer token, so every API request the emulator records names the replica that sent it. The runs are
created once every replica's Lease shows the same applied view (membership settled), so the figures are
about sharing the work, not about joining. A run counts for the replica that wrote its terminal status;
a run whose status two replicas wrote was executed by both, and model requests beyond 5 per run are
iterations sent again (a run stopped and resumed, e.g. after its replica fenced itself, which the
replica's log says).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import importlib.util
import json
import math
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.messages.api import FakeMessagesAPI
from bench.cluster import (
    BENCH_USER_AGENT,
    CRD,
    OperatorProcess,
    ProcessSampler,
    RecordingEmulator,
    create_runs,
)
from bench.conversation import API_KEY
from bench.figures import Figure, Section, Target, median, percentile, progress
from bench.operator_scale import MODEL_REQUESTS, scale_manifests, scale_script

NAMESPACE = "default"
"""Where the runs and the replicas' Leases live (the chart puts the Leases in the release namespace)."""
GROUP_LABEL = "agentrun.dev/replica-group"
APPLIED_VIEW = "agentrun.dev/applied-view"
SETTLE_SECONDS = 60.0
FENCE_LOG = "fences itself and stops its runs"
"""What the membership logs when a replica stops all its runs because its Lease renewal is too old."""
RESOURCES = ("agentruns", "secrets", "events", "leases", "agentrunquotas")
"""What a run leaves in etcd (counted and sized after the run, for the 10,000-run estimate)."""


QUOTA_CRD = CRD.with_name("agentrunquotas.agentrun.dev.yaml")
QUOTA = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "AgentRunQuota",
    "metadata": {"name": "bench", "namespace": NAMESPACE},
    "spec": {"window": "Day", "hard": {"tokens": 10**12, "costUSD": 10**6}},
}
"""With ``--replica-quota``: a quota no run reaches, so every model request is reserved and settled in its
ledger (the write load of quotas across replicas, with none refused)."""


def membership_available() -> bool:
    """Whether this build has replica membership; without it every replica executes every run."""
    try:
        return importlib.util.find_spec("agentrun.controller.replicas.membership") is not None
    except ModuleNotFoundError:  # not even the package
        return False


def view_id(members: list[str]) -> str:
    """The contract's view id: the first 12 hex digits of sha256 over the sorted live member names."""
    return hashlib.sha256("\n".join(sorted(members)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Replica:
    name: str
    token: str
    process: OperatorProcess
    sampler: ProcessSampler


@dataclass(frozen=True)
class ReplicaFigures:
    name: str
    runs: int
    iterations: int
    cpu_seconds: float
    writes: int
    peak_rss_mib: float
    wall: float

    @property
    def cpu_ms_per_iteration(self) -> float:
        return self.cpu_seconds / self.iterations * 1000 if self.iterations else math.nan

    @property
    def writes_per_iteration(self) -> float:
        return self.writes / self.iterations if self.iterations else math.nan

    @property
    def cores(self) -> float:
        return self.cpu_seconds / self.wall


@dataclass(frozen=True)
class ReplicaRun:
    replicas: int
    runs: int
    makespan: float
    """First creation → last terminal status write (or → giving up, when runs were left unfinished)."""
    finished: int
    unfinished: dict[str, int]
    """Phase → runs not finished when the benchmark gave up (60 s + 0.2 s per run)."""
    fences: int
    """Times a replica fenced itself (its Lease renewal came too late), from the operator logs."""
    first_request_latencies: list[float]
    iterations: int
    cpu_seconds: float
    writes: int
    succeeded: int
    written_by_two: int
    """Runs whose status more than one replica patched."""
    extra_requests: int
    """Model requests beyond MODEL_REQUESTS per run: iterations sent twice."""
    settle_seconds: float | None
    """Start of the last replica → every Lease shows one applied view (None: membership never settled)."""
    bench_cpu: float
    per_replica: list[ReplicaFigures]
    breakdown: dict[str, float]
    """Operator writes per iteration, by kind, all replicas."""
    conflicts: int
    """Operator requests answered 409 Conflict (a read-modify-write lost a race: Leases, quota ledgers)."""
    stored: dict[str, tuple[int, int]]
    """Resource → (objects, JSON bytes) in the namespace after the runs finished."""

    @property
    def cpu_ms_per_iteration(self) -> float:
        return self.cpu_seconds / max(self.iterations, 1) * 1000

    @property
    def writes_per_iteration(self) -> float:
        return self.writes / max(self.iterations, 1)


@contextlib.asynccontextmanager
async def running_replicas(
    workdir: Path,
    kube: EmulatedCluster,
    *,
    count: int,
    model_url: str,
    max_concurrent_runs: int,
    label: str,
    lease_seconds: int | None,
) -> AsyncIterator[list[Replica]]:
    """``count`` operator processes in one replica group, each with its own identity towards the API."""
    group = f"bench-{label}"
    processes: list[tuple[str, str, OperatorProcess]] = []
    for index in range(count):
        name, token = f"replica-{index}", f"bench-{label}-replica-{index}"
        process = OperatorProcess(
            kubeconfig=kube.kubeconfig_for(token),
            log_path=workdir / f"operator-{label}-{name}.log",
            env={
                "ANTHROPIC_API_KEY": API_KEY,
                "ANTHROPIC_BASE_URL": model_url,
                "AGENTRUN_LEASE_NAMESPACE": NAMESPACE,
                "AGENTRUN_REPLICA_GROUP": group,
                "AGENTRUN_REPLICA_NAME": name,
                **({"AGENTRUN_LEASE_DURATION_SECONDS": str(lease_seconds)} if lease_seconds else {}),
            },
            args=("--max-concurrent-runs", str(max_concurrent_runs)),
        )
        processes.append((name, token, process))
    replicas: list[Replica] = []
    try:
        await asyncio.gather(*(process.start(ready_timeout=60.0) for _, _, process in processes))
        for name, token, process in processes:
            assert process.process is not None
            replicas.append(Replica(name, token, process, ProcessSampler(process.process.pid)))
            replicas[-1].sampler.start()
        yield replicas
    finally:
        for replica in replicas:
            await replica.sampler.stop()
        await asyncio.gather(*(process.stop(timeout=10.0) for _, _, process in processes))


async def settled(emulator: RecordingEmulator, group: str, count: int, timeout: float) -> float | None:
    """Seconds until ``count`` Leases of the group all show the view of their holders as applied."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        leases = [
            lease
            for lease in emulator.list_objects("leases", NAMESPACE)
            if (lease["metadata"].get("labels") or {}).get(GROUP_LABEL) == group
        ]
        members = [str((lease.get("spec") or {}).get("holderIdentity")) for lease in leases]
        applied = {(lease["metadata"].get("annotations") or {}).get(APPLIED_VIEW) for lease in leases}
        if len(leases) == count and applied == {view_id(members)}:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    return None


async def one_run(
    workdir: Path,
    replicas: int,
    runs: int,
    latency: float,
    label: str,
    lease_seconds: int | None,
    quota: bool,
) -> ReplicaRun:
    api = FakeMessagesAPI(scripts=[scale_script()], latency_seconds=latency, demo_brain=False)
    emulator = RecordingEmulator(strict=False)
    cpu_me = ProcessSampler(os.getpid())
    async with (
        api.running() as server,
        EmulatedCluster.running(crd_paths=[CRD, QUOTA_CRD] if quota else [CRD], emulator=emulator) as kube,
        running_replicas(
            workdir,
            kube,
            count=replicas,
            model_url=server.url,
            max_concurrent_runs=max(runs, 1000),
            label=label,
            lease_seconds=lease_seconds,
        ) as members,
    ):
        if quota:
            await _create(
                kube.url, f"/apis/agentrun.dev/v1alpha1/namespaces/{NAMESPACE}/agentrunquotas", QUOTA
            )
        settle = (
            await settled(emulator, f"bench-{label}", replicas, SETTLE_SECONDS)
            if membership_available()
            else None
        )
        if settle is None and membership_available():
            progress(
                f"replicas: {label}: membership did not settle in {SETTLE_SECONDS:g} s; creating runs anyway"
            )
        manifests = scale_manifests(runs, "replicas")
        cpu_me.start()
        log_start = len(emulator.timed)
        cpu_0 = {m.name: m.sampler.cpu_seconds() for m in members}
        me_0 = cpu_me.cpu_seconds()
        started = time.time()
        created = await create_runs(kube.url, manifests)
        deadline = time.monotonic() + 60 + runs * 0.2
        while len(emulator.finished_at) < runs and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        wall = time.time() - started
        cpu = {m.name: m.sampler.cpu_seconds() - cpu_0[m.name] for m in members}
        bench_cpu = (cpu_me.cpu_seconds() - me_0) / wall
        await cpu_me.stop()
        unfinished = collections.Counter(
            str((o.get("status") or {}).get("phase"))
            for o in emulator.list_objects("agentruns", NAMESPACE)
            if o["metadata"]["name"] not in emulator.finished_at
        )
        if unfinished:
            progress(f"replicas: {label}: unfinished after {wall:.0f} s, by phase: {dict(unfinished)}")
        end = max(emulator.finished_at.values(), default=started) if not unfinished else started + wall
        objects = emulator.list_objects("agentruns", NAMESPACE)
        stored = {
            resource: _stored(emulator.list_objects(resource, NAMESPACE))
            for resource in RESOURCES
            if quota or resource != "agentrunquotas"
        }
        peaks = {m.name: m.sampler.peak_rss for m in members}
        tokens = {f"Bearer {m.token}": m.name for m in members}
        window = [t for t in emulator.timed[log_start:] if not t.from_bench and t.at <= end]
        arrivals: dict[str, list[float]] = collections.defaultdict(list)
        for request in api.requests:
            arrivals["replicas-" + request.first_user_text.split("run-", 1)[1][:5]].append(request.arrived_at)
    iterations_of = {
        o["metadata"]["name"]: int((o.get("status") or {}).get("iterations") or 0) for o in objects
    }
    finisher = {name: tokens.get(by or "", "?") for name, by in emulator.finished_by.items()}
    writers: dict[str, set[str]] = collections.defaultdict(set)
    writes_by: collections.Counter[str] = collections.Counter()
    for t in window:
        if not t.is_write:
            continue
        who = tokens.get(t.record.authorization or "", "?")
        writes_by[who] += 1
        if t.record.resource == "agentruns" and t.record.name is not None:
            writers[t.record.name].add(who)
    iterations = sum(iterations_of.values())
    per_replica = [
        ReplicaFigures(
            name=m.name,
            runs=sum(1 for who in finisher.values() if who == m.name),
            iterations=sum(iterations_of.get(run, 0) for run, who in finisher.items() if who == m.name),
            cpu_seconds=cpu[m.name],
            writes=writes_by[m.name],
            peak_rss_mib=peaks[m.name] / 2**20,
            wall=wall,
        )
        for m in members
    ]
    kinds = collections.Counter(t.kind for t in window if t.is_write)
    first = {name: times[0] for name, times in arrivals.items()}
    return ReplicaRun(
        replicas=replicas,
        runs=runs,
        makespan=end - started,
        finished=len(emulator.finished_at),
        unfinished=dict(unfinished),
        fences=sum(m.process.logs().count(FENCE_LOG) for m in members),
        first_request_latencies=[first[n] - created[n] for n in created if n in first],
        iterations=iterations,
        cpu_seconds=sum(cpu.values()),
        writes=sum(writes_by.values()),
        succeeded=sum(1 for o in objects if (o.get("status") or {}).get("phase") == "Succeeded"),
        written_by_two=sum(1 for who in writers.values() if len(who) > 1),
        extra_requests=sum(max(0, len(times) - MODEL_REQUESTS) for times in arrivals.values()),
        settle_seconds=settle,
        bench_cpu=bench_cpu,
        per_replica=per_replica,
        breakdown={kind: count / max(iterations, 1) for kind, count in kinds.most_common()},
        conflicts=sum(1 for t in window if t.record.status == 409),
        stored=stored,
    )


async def _create(url: str, path: str, body: dict[str, Any]) -> None:
    async with (
        aiohttp.ClientSession(headers={"User-Agent": BENCH_USER_AGENT}) as session,
        session.post(url + path, json=body) as response,
    ):
        if response.status >= 300:
            raise RuntimeError(f"creating {path}: {await response.text()}")


def _stored(objects: list[dict[str, Any]]) -> tuple[int, int]:
    return len(objects), sum(len(json.dumps(o, separators=(",", ":"))) for o in objects)


def _report(section: Section, results: list[ReplicaRun], *, ideal: float) -> None:
    count, runs = results[0].replicas, results[0].runs
    prefix = f"{runs} runs, {count} replica{'s' if count > 1 else ''}"

    def fig(name: str, values: list[float], unit: str, target: Target | None = None, note: str = "") -> None:
        section.add(Figure(f"{prefix}: {name}", median(values), unit, len(results), target, note))

    fig("runs finished", [float(r.finished) for r in results], "", Target(runs, at_most=False))
    fig("time to finish all ÷ ideal", [r.makespan / ideal for r in results], "×", note=f"ideal {ideal:g} s")
    fig("create → first model request p50", [percentile(r.first_request_latencies, 50) for r in results], "s")
    fig("create → first model request p99", [percentile(r.first_request_latencies, 99) for r in results], "s")
    fig("operator CPU per iteration, all replicas", [r.cpu_ms_per_iteration for r in results], "ms")
    fig("API writes per iteration, all replicas", [r.writes_per_iteration for r in results], "")
    fig(
        "CPU per iteration, busiest replica",
        [max(p.cpu_ms_per_iteration for p in r.per_replica) for r in results],
        "ms",
    )
    fig("cores busy, busiest replica", [max(p.cores for p in r.per_replica) for r in results], "")
    fig(
        "runs on the busiest replica ÷ even share",
        [max(p.runs for p in r.per_replica) / (r.runs / r.replicas) for r in results],
        "×",
    )
    fig("API conflicts (409) per iteration", [r.conflicts / max(r.iterations, 1) for r in results], "")
    fig("bench process CPU (emulator + fake API)", [r.bench_cpu for r in results], "")
    fig(
        "runs executed by more than one replica",
        [float(r.written_by_two) for r in results],
        "",
        Target(0.0),
        note="status written by two replicas",
    )
    fig(
        "replicas fencing themselves (Lease renewal too late)",
        [float(r.fences) for r in results],
        "",
        Target(0.0),
        note="each stops and hands back every run it executes",
    )
    fig(
        "model requests repeated",
        [float(r.extra_requests) for r in results],
        "",
        Target(0.0),
        note=f"beyond {MODEL_REQUESTS} per run",
    )
    last = results[-1]
    rows = "\n".join(
        f"| {p.name} | {p.runs} | {p.iterations} | {p.cpu_seconds:.1f} | {p.cores:.2f} | "
        f"{p.cpu_ms_per_iteration:.2f} | {p.writes} | {p.writes_per_iteration:.2f} | {p.peak_rss_mib:.0f} |"
        for p in last.per_replica
    )
    writes = ", ".join(f"{kind} {value:.3f}" for kind, value in last.breakdown.items())
    stored = ", ".join(
        f"{resource} {n} objects, {size / 1024:,.0f} KiB ({size / max(n, 1) / 1024:.1f} KiB each)"
        for resource, (n, size) in last.stored.items()
    )
    settle = (
        "membership never settled"
        if last.settle_seconds is None
        else f"membership settled {last.settle_seconds:.1f} s after the last replica was ready"
    )
    section.details.append(
        f"**{prefix}, per replica** (last repeat; {settle}; wall time {last.makespan:.1f} s):\n\n"
        "| replica | runs | iterations | CPU s | cores busy | CPU ms per iteration | writes | "
        "writes per iteration | peak RSS MiB |\n| --- |" + " ---: |" * 8 + "\n"
        f"{rows}\n\nWrites per iteration by kind, all replicas: {writes}. Stored in the namespace after the "
        f"runs: {stored}."
    )
    for r in results:
        if r.unfinished:
            section.notes.append(
                f"{prefix}: {r.runs - r.finished} runs unfinished when the benchmark gave up after "
                f"{r.makespan:.0f} s (by phase: {r.unfinished}); time to finish is then that time."
            )
    failed = [r.runs - r.succeeded for r in results]
    if any(failed):
        section.notes.append(f"{prefix}: runs not Succeeded per repeat: {failed} (see the operator logs)")


async def measure(
    section: Section,
    workdir: Path,
    *,
    counts: list[int],
    runs: int,
    repeats: int,
    latency: float,
    lease_seconds: int | None = None,
    quota: bool = False,
) -> None:
    ideal = MODEL_REQUESTS * latency
    if not membership_available():
        section.notes.append(
            "This build has no replica membership (agentrun.controller.replicas.membership): every replica "
            "executes every run, so the figures above 1 replica measure duplicated work."
        )
    for count in counts:
        progress(f"replicas: {runs} runs on {count} replica(s) × {repeats} repeats")
        results = [
            await one_run(workdir, count, runs, latency, f"replicas-{count}-{runs}-{r}", lease_seconds, quota)
            for r in range(repeats)
        ]
        _report(section, results, ideal=ideal)
    lease = f"{lease_seconds} s (AGENTRUN_LEASE_DURATION_SECONDS)" if lease_seconds else "the default"
    section.notes.append(
        f"Lease duration: {lease}; renew interval: the default. "
        + (
            "A namespace AgentRunQuota no run reaches (tokens 10^12, $10^6 a day) was in place: every "
            "model request was reserved and settled in its ledger."
            if quota
            else "No AgentRunQuota (the quota ledger writes nothing)."
        )
    )
    section.notes.append(
        "Every replica is a separate `agentrun operator` process on this machine, sharing its cores with "
        "the others and with the emulator and fake Messages API (the bench process); CPU per iteration "
        "is the replicas' CPU from the first creation to the last terminal status write ÷ the iterations "
        "they ran. Writes include each replica's Lease renewals. Runs per replica: who wrote the terminal "
        "status."
    )
