"""Benchmark 6: N concurrent AgentRuns shared by 1, 2 and 4 operator replicas, separate processes.

The same runs as the scale benchmark (5 model requests each, 1 s model latency; ideal finish 5 s after the
first creation), served by R ``agentrun operator`` processes that share one replica group: each has
AGENTRUN_LEASE_NAMESPACE set to the benchmark namespace, its own AGENTRUN_REPLICA_NAME, metrics port,
bearer token and Anthropic API key, so every API request the server side records and every model request
the fake Messages API receives names the replica that sent it. On the emulator the emulator records the
requests; on a real API server (``--kubeconfig``) the replicas reach it through the recording TLS proxy
of the real-server scale benchmark, which reads each replica's token before it forwards the request with
the benchmark's own credentials, in a throwaway namespace (deleted afterwards). The runs are created once
every replica's Lease, read through the API, shows the same applied view (membership settled), so the
figures are about sharing the work, not about joining. A run counts for the replica that wrote its
terminal status; a run two replicas executed at once has model requests of both in flight together.
A model request for an iteration the run had already asked for is a repeat: of an iteration in flight
(its answer was lost with the replica that asked, or the replica fenced itself, which its log says) or,
never expected, of an iteration already checkpointed (the run had gone on to the next one). With
``--replica-kill S``, one replica (not the first) is SIGKILLed S seconds after the runs were created;
its unfinished runs (their rendezvous owner under the view before the kill) must resume elsewhere, and
the time from the kill to each one's first model request from another replica is the failover time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import psutil

from agentrun.controller.replicas.ring import view_id
from agentrun.settings import Settings
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
from bench.real_server import ProxiedRequest, RealServer, RecordingProxy, prepared, run_written
from bench.replica_figures import (
    Kill,
    Observed,
    OperatorRequest,
    QuotaPeak,
    ReplicaRun,
    Rescale,
    attribute,
    figures,
    model_request,
)

NAMESPACE = "default"
"""Where the runs and the replicas' Leases live on the emulator (the chart puts the Leases in the release
namespace); a real server gets a fresh namespace per repeat."""
RUN_PREFIX = "replicas"
GROUP_LABEL = "agentrun.dev/replica-group"
APPLIED_VIEW = "agentrun.dev/applied-view"
SETTLE_SECONDS = 60.0
FENCE_LOG = "fences itself and stops its runs"
"""What the membership logs when a replica stops all its runs because its Lease renewal is too old."""
RESOURCES = ("agentruns", "secrets", "events", "leases", "agentrunquotas")
"""What a run leaves in etcd (counted and sized after the run, for the 10,000-run estimate)."""
DEFAULT_LEASE_SECONDS = int(Settings.model_fields["lease_duration_seconds"].default)
KILLED = 1
"""Index of the replica ``--replica-kill`` kills: not the first, so "replica-0" always survives."""


QUOTA_CRD = CRD.with_name("agentrunquotas.agentrun.dev.yaml")
QUOTA = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "AgentRunQuota",
    "metadata": {"name": "bench", "namespace": NAMESPACE},
    "spec": {"window": "Day", "hard": {"tokens": 10**12, "costUSD": 10**6}},
}
"""With ``--replica-quota``: a quota no run reaches, so every model request is reserved and settled in its
ledger (the write load of quotas across replicas, with none refused)."""
#: How often the quota object's size is sampled while the runs go on, and what an empty ledger weighs
#: (its spec, metadata and totals; what is left once every run released its place).
QUOTA_SAMPLE_SECONDS = 1.0
EMPTY_QUOTA_BYTES = 1800
#: etcd's default limit on one request (--max-request-bytes): no object can be larger.
REQUEST_LIMIT_BYTES = 1.5 * 2**20


def settled_view(leases: list[dict[str, Any]], group: str, count: int, *, without: str | None = None) -> bool:
    """Whether ``count`` Leases of the group all show the view of their holders as applied; ``without``:
    leaving out a killed replica's Lease, which stays (unrenewed) until it is garbage."""
    mine = [
        lease
        for lease in leases
        if (lease["metadata"].get("labels") or {}).get(GROUP_LABEL) == group
        and (lease.get("spec") or {}).get("holderIdentity") != without
    ]
    members = [str((lease.get("spec") or {}).get("holderIdentity")) for lease in mine]
    applied = {(lease["metadata"].get("annotations") or {}).get(APPLIED_VIEW) for lease in mine}
    return len(mine) == count and applied == {view_id(members)}


class Server(Protocol):
    """The API server side of one repeat, emulated or real, as the measurement sees it."""

    namespace: str
    operator_args: tuple[str, ...]
    """Extra ``agentrun operator`` arguments (a real server: serve only the benchmark's namespace)."""
    patience: float
    """Seconds per run, on top of a minute, the benchmark waits for the runs before it gives up."""

    def kubeconfig_for(self, token: str) -> Path: ...

    def mark(self) -> int:
        """A position in the request log: what :meth:`requests_since` counts from."""
        ...

    def requests_since(self, mark: int, replicas: Mapping[str, str]) -> list[OperatorRequest]:
        """The replicas' requests since ``mark``; ``replicas`` maps each ``Authorization`` to a replica."""
        ...

    def finished_at(self) -> Mapping[str, float]: ...

    def finished_by(self, replicas: Mapping[str, str]) -> dict[str, str]: ...

    async def create(self, resource: str, body: dict[str, Any]) -> None: ...

    async def create_runs(self, manifests: list[dict[str, Any]]) -> dict[str, float]: ...

    async def list(self, resource: str) -> list[dict[str, Any]]: ...


@dataclass
class EmulatedServer:
    """The emulator in this process: it records every request itself, with the bearer token."""

    kube: EmulatedCluster
    emulator: RecordingEmulator
    namespace: str = NAMESPACE
    operator_args: tuple[str, ...] = ()
    patience: float = 0.2

    def kubeconfig_for(self, token: str) -> Path:
        return self.kube.kubeconfig_for(token)

    def mark(self) -> int:
        return len(self.emulator.timed)

    def requests_since(self, mark: int, replicas: Mapping[str, str]) -> list[OperatorRequest]:
        return [
            OperatorRequest(
                at=t.at,
                replica=attribute(t.record.authorization, replicas),
                kind=t.kind,
                is_write=t.is_write,
                status=t.record.status,
                run=t.record.name if t.is_write and t.record.resource == "agentruns" else None,
            )
            for t in self.emulator.timed[mark:]
            if not t.from_bench
        ]

    def finished_at(self) -> Mapping[str, float]:
        return self.emulator.finished_at

    def finished_by(self, replicas: Mapping[str, str]) -> dict[str, str]:
        return {run: attribute(by, replicas) for run, by in self.emulator.finished_by.items()}

    async def create(self, resource: str, body: dict[str, Any]) -> None:
        path = f"/apis/agentrun.dev/v1alpha1/namespaces/{self.namespace}/{resource}"
        async with (
            aiohttp.ClientSession(headers={"User-Agent": BENCH_USER_AGENT}) as session,
            session.post(self.kube.url + path, json=body) as response,
        ):
            if response.status >= 300:
                raise RuntimeError(f"creating {path}: {await response.text()}")

    async def create_runs(self, manifests: list[dict[str, Any]]) -> dict[str, float]:
        return await create_runs(self.kube.url, manifests)

    async def list(self, resource: str) -> list[dict[str, Any]]:
        return self.emulator.list_objects(resource, self.namespace)


@dataclass
class ProxiedServer:
    """A real API server, the replicas behind the recording proxy, the benchmark on its own admin session."""

    server: RealServer
    proxy: RecordingProxy
    namespace: str
    operator_args: tuple[str, ...] = field(init=False)
    patience: float = 0.5

    def __post_init__(self) -> None:
        self.operator_args = ("--namespace", self.namespace)

    def kubeconfig_for(self, token: str) -> Path:
        return self.proxy.kubeconfig(self.namespace, token)

    def mark(self) -> int:
        return len(self.proxy.requests)

    def requests_since(self, mark: int, replicas: Mapping[str, str]) -> list[OperatorRequest]:
        return [proxied(r, replicas) for r in self.proxy.requests[mark:]]

    def finished_at(self) -> Mapping[str, float]:
        return self.proxy.finished_at

    def finished_by(self, replicas: Mapping[str, str]) -> dict[str, str]:
        return {run: attribute(by, replicas) for run, by in self.proxy.finished_by.items()}

    async def create(self, resource: str, body: dict[str, Any]) -> None:
        await self.server.create(self.namespace, resource, body)

    async def create_runs(self, manifests: list[dict[str, Any]]) -> dict[str, float]:
        return await self.server.create_runs(self.namespace, manifests)

    async def list(self, resource: str) -> list[dict[str, Any]]:
        return await self.server.list(self.namespace, resource)


def proxied(request: ProxiedRequest, replicas: Mapping[str, str]) -> OperatorRequest:
    """A request the proxy recorded, attributed to the replica whose token it carried."""
    return OperatorRequest(
        at=request.at,
        replica=attribute(request.client, replicas),
        kind=request.kind,
        is_write=request.is_write,
        status=request.status,
        run=run_written(request.method, request.path),
    )


Serving = Callable[[str, bool], AbstractAsyncContextManager[Server]]
"""Label and whether a quota is wanted → the server side of one repeat."""


def emulated() -> Serving:
    @contextlib.asynccontextmanager
    async def serve(label: str, quota: bool) -> AsyncIterator[Server]:
        emulator = RecordingEmulator(strict=False)
        crds = [CRD, QUOTA_CRD] if quota else [CRD]
        async with EmulatedCluster.running(crd_paths=crds, emulator=emulator) as kube:
            yield EmulatedServer(kube, emulator)

    return serve


def real(kubeconfig: Path, workdir: Path) -> Serving:
    @contextlib.asynccontextmanager
    async def serve(label: str, quota: bool) -> AsyncIterator[Server]:
        async with prepared(kubeconfig, workdir, f"realbench-{label}-{os.getpid()}") as (
            server,
            namespace,
            proxy,
        ):
            yield ProxiedServer(server, proxy, namespace)

    return serve


@dataclass
class Replica:
    name: str
    token: str
    api_key: str
    process: OperatorProcess
    sampler: ProcessSampler | None = None
    killed: Kill | None = None
    cpu_at_stop: float | None = None
    """CPU seconds when it stopped (SIGKILL, or the last sample before it exited after SIGTERM)."""

    def cpu_seconds(self) -> float:
        if self.cpu_at_stop is not None:
            return self.cpu_at_stop
        return 0.0 if self.sampler is None else self.sampler.cpu_seconds()

    async def start(self) -> None:
        await self.process.start(ready_timeout=60.0)
        assert self.process.process is not None
        self.sampler = ProcessSampler(self.process.process.pid)
        self.sampler.start()

    async def kill(self, members: tuple[str, ...]) -> Kill:
        """SIGKILL: no graceful leave, the Lease stays until it expires."""
        self.cpu_at_stop = self.cpu_seconds()
        self.killed = Kill(self.name, time.time(), members)
        await self.process.stop(kill=True)
        return self.killed

    async def leave(self) -> None:
        """SIGTERM, as a scale-down sends: it hands its runs over at their next checkpoints and deletes
        its Lease. Its CPU is sampled until it exits (the handoff is its work too)."""
        stopping = asyncio.ensure_future(self.process.stop(timeout=60.0))
        last = self.cpu_seconds()
        while not stopping.done():
            with contextlib.suppress(psutil.Error):
                last = self.cpu_seconds()
            await asyncio.sleep(0.1)
        await stopping
        self.cpu_at_stop = last


@contextlib.asynccontextmanager
async def running_replicas(
    workdir: Path,
    server: Server,
    *,
    count: int,
    model_url: str,
    max_concurrent_runs: int,
    label: str,
    lease_seconds: int | None,
    started: int | None = None,
) -> AsyncIterator[list[Replica]]:
    """``count`` operator processes in one replica group, each with its own identity towards the API;
    only the first ``started`` of them running at first (None: all)."""
    replicas: list[Replica] = []
    for index in range(count):
        name, token = f"replica-{index}", f"bench-{label}-replica-{index}"
        api_key = f"{API_KEY}-{name}"
        process = OperatorProcess(
            kubeconfig=server.kubeconfig_for(token),
            log_path=workdir / f"operator-{label}-{name}.log",
            env={
                "ANTHROPIC_API_KEY": api_key,
                "ANTHROPIC_BASE_URL": model_url,
                "AGENTRUN_LEASE_NAMESPACE": server.namespace,
                "AGENTRUN_REPLICA_GROUP": f"bench-{label}",
                "AGENTRUN_REPLICA_NAME": name,
                **({"AGENTRUN_LEASE_DURATION_SECONDS": str(lease_seconds)} if lease_seconds else {}),
            },
            args=("--max-concurrent-runs", str(max_concurrent_runs), *server.operator_args),
        )
        replicas.append(Replica(name, token, api_key, process))
    try:
        await asyncio.gather(*(r.start() for r in replicas[:started]))
        yield replicas
    finally:
        for replica in replicas:
            if replica.sampler is not None:
                await replica.sampler.stop()
        await asyncio.gather(*(r.process.stop(timeout=10.0) for r in replicas))


async def settled(
    server: Server, group: str, count: int, timeout: float, *, without: str | None = None
) -> float | None:
    """Seconds until ``count`` Leases of the group, read through the API, show one applied view."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if settled_view(await server.list("leases"), group, count, without=without):
            return time.monotonic() - started
        await asyncio.sleep(0.2)
    return None


async def one_run(
    workdir: Path,
    serving: Serving,
    replicas: int,
    runs: int,
    latency: float,
    label: str,
    *,
    lease_seconds: int | None,
    quota: bool,
    kill_after: float | None,
    rescale: tuple[float, float] | None = None,
) -> ReplicaRun:
    api = FakeMessagesAPI(scripts=[scale_script()], latency_seconds=latency, demo_brain=False)
    cpu_me = ProcessSampler(os.getpid())
    async with (
        api.running() as fake,
        serving(label, quota) as server,
        running_replicas(
            workdir,
            server,
            count=replicas,
            model_url=fake.url,
            max_concurrent_runs=max(runs, 1000),
            label=label,
            lease_seconds=lease_seconds,
            started=1 if rescale is not None else None,
        ) as members,
    ):
        if quota:
            await server.create("agentrunquotas", QUOTA)
        at_first = 1 if rescale is not None else replicas
        settle = await settled(server, f"bench-{label}", at_first, SETTLE_SECONDS)
        if settle is None:
            progress(
                f"replicas: {label}: membership did not settle in {SETTLE_SECONDS:g} s; creating runs anyway"
            )
        cpu_me.start()
        mark = server.mark()
        cpu_0 = {m.name: m.cpu_seconds() for m in members}
        me_0 = cpu_me.cpu_seconds()
        load_0 = os.getloadavg()[0]
        started = time.time()
        created = await server.create_runs(scale_manifests(runs, RUN_PREFIX))
        rescaling = (
            None
            if rescale is None
            else asyncio.ensure_future(
                _rescaled(server, f"bench-{label}", members, *rescale, time.monotonic())
            )
        )
        kill_at = None if kill_after is None else time.monotonic() + kill_after
        kill: Kill | None = None
        regrouped: asyncio.Task[float | None] | None = None
        failover = (lease_seconds or DEFAULT_LEASE_SECONDS) + 30 if kill_at is not None else 0
        patience = 60 + runs * server.patience + failover
        deadline = time.monotonic() + patience
        quota_peak: QuotaPeak | None = None
        next_sample = time.monotonic()
        while len(server.finished_at()) < runs and time.monotonic() < deadline:
            if quota and time.monotonic() >= next_sample:
                next_sample = time.monotonic() + QUOTA_SAMPLE_SECONDS
                for obj in await server.list("agentrunquotas"):
                    quota_peak = _quota_size(obj).bigger(quota_peak)
            if kill_at is not None and kill is None and time.monotonic() >= kill_at:
                kill = await members[KILLED].kill(tuple(m.name for m in members))
                progress(f"replicas: {label}: SIGKILLed {kill.replica}")
                regrouped = asyncio.ensure_future(
                    settled(server, f"bench-{label}", replicas - 1, patience, without=kill.replica)
                )
            await asyncio.sleep(0.05)
        if kill_at is not None and kill is None:
            progress(f"replicas: {label}: every run finished before the kill was due; nothing killed")
        scaled: Rescale | None = None
        if rescaling is not None and rescaling.done():
            scaled = rescaling.result()
        elif rescaling is not None:
            progress(f"replicas: {label}: every run finished before the scale-down; its figures are left out")
            rescaling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await rescaling
        wall = time.time() - started
        survivors_settled = None
        if regrouped is not None and regrouped.done():
            survivors_settled = regrouped.result()
        elif regrouped is not None:
            regrouped.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await regrouped
        cpu = {m.name: m.cpu_seconds() - cpu_0[m.name] for m in members}
        bench_cpu = (cpu_me.cpu_seconds() - me_0) / wall
        load_1 = os.getloadavg()[0]
        await cpu_me.stop()
        tokens = {f"Bearer {m.token}": m.name for m in members}
        keys = {m.api_key: m.name for m in members}
        observed = Observed(
            replicas=tuple(m.name for m in members),
            runs=runs,
            objects=await server.list("agentruns"),
            requests=server.requests_since(mark, tokens),
            model_requests=[
                request
                for recorded in api.requests
                if (request := model_request(recorded, keys, RUN_PREFIX)) is not None
            ],
            created=created,
            finished_at=dict(server.finished_at()),
            finished_by=server.finished_by(tokens),
            started=started,
            wall=wall,
            cpu=cpu,
            peak_rss={m.name: m.sampler.peak_rss if m.sampler else 0 for m in members},
            bench_cpu=bench_cpu,
            latency=latency,
            settle_seconds=settle,
            fences=sum(m.process.logs().count(FENCE_LOG) for m in members),
            stored={
                resource: _stored(await server.list(resource))
                for resource in RESOURCES
                if quota or resource != "agentrunquotas"
            },
            load=(load_0, load_1),
            kill=kill if kill is None else dataclasses.replace(kill, regrouped=survivors_settled),
            rescale=scaled,
            quota_peak=quota_peak,
        )
    result = figures(observed)
    if result.unfinished:
        progress(f"replicas: {label}: unfinished after {wall:.0f} s, by phase: {result.unfinished}")
    return result


async def _rescaled(
    server: Server, group: str, members: list[Replica], up_after: float, down_after: float, created: float
) -> Rescale:
    """Scale 1 → N → 1 while the runs go on: start the other replicas ``up_after`` seconds after the
    runs were created, SIGTERM them ``down_after`` seconds after it, as a rollout or a scale-down does."""
    others = members[1:]
    await asyncio.sleep(max(0.0, created + up_after - time.monotonic()))
    progress(f"replicas: {group}: starting {len(others)} more replica(s)")
    began = time.monotonic()
    await asyncio.gather(*(m.start() for m in others))
    joined = await settled(server, group, len(members), SETTLE_SECONDS)
    joined_after = None if joined is None else time.monotonic() - began
    await asyncio.sleep(max(0.0, created + down_after - time.monotonic()))
    progress(f"replicas: {group}: SIGTERM to {', '.join(m.name for m in others)}")
    sigterm = time.monotonic()
    alone = asyncio.ensure_future(settled(server, group, 1, SETTLE_SECONDS + 60))
    await asyncio.gather(*(m.leave() for m in others))
    left = time.monotonic() - sigterm
    return Rescale(up_after, down_after, joined_after, left, await alone)


def _quota_size(obj: dict[str, Any]) -> QuotaPeak:
    status = obj.get("status") or {}
    return QuotaPeak(
        len(json.dumps(obj, separators=(",", ":"))),
        len(status.get("admitted") or []),
        len(status.get("reservations") or []),
    )


def _stored(objects: list[dict[str, Any]]) -> tuple[int, int]:
    return len(objects), sum(len(json.dumps(o, separators=(",", ":"))) for o in objects)


def _two(value: float) -> str:
    """Two decimals, or a dash for a replica with no iterations (one killed before it finished any)."""
    return "—" if math.isnan(value) else f"{value:.2f}"


def report(
    section: Section, results: list[ReplicaRun], *, ideal: float, lease: int, server_side: str
) -> None:
    count, runs = results[0].replicas, results[0].runs
    prefix = f"{runs} runs, {count} replica{'s' if count > 1 else ''}"

    def fig(name: str, values: list[float], unit: str, target: Target | None = None, note: str = "") -> None:
        section.add(Figure(f"{prefix}: {name}", median(values), unit, len(results), target, note))

    fig("runs finished", [float(r.finished) for r in results], "", Target(runs, at_most=False))
    fig("time to finish all ÷ ideal", [r.makespan / ideal for r in results], "×", note=f"ideal {ideal:g} s")
    fig("create → first model request p50", [percentile(r.first_request_latencies, 50) for r in results], "s")
    fig("create → first model request p99", [percentile(r.first_request_latencies, 99) for r in results], "s")
    fig(
        "operator CPU per iteration, all replicas",
        [r.cpu_ms_per_iteration for r in results],
        "ms",
        Target(1.5),
    )
    fig("API writes per iteration, all replicas", [r.writes_per_iteration for r in results], "", Target(1.0))
    fig(
        "bytes kept in etcd per iteration (objects left after the runs)",
        [sum(size for _, size in r.stored.values()) / max(r.iterations, 1) / 1024 for r in results],
        "KiB",
        note="runs, transcript chunks, Events, Leases of the namespace as JSON",
    )
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
    peaks = [r.quota_peak for r in results if r.quota_peak is not None]
    if peaks:
        fig(
            "quota object at its largest",
            [p.size / 1024 for p in peaks],
            "KiB",
            note=", ".join(f"{p.admitted} runs admitted, {p.reservations} reservations" for p in peaks),
        )
        per_entry = [(p.size - EMPTY_QUOTA_BYTES) / max(p.admitted, 1) for p in peaks if p.admitted]
        if per_entry:
            fig(
                "running runs one quota object can hold (1.5 MiB ÷ bytes per admitted run at the peak)",
                [REQUEST_LIMIT_BYTES / size for size in per_entry],
                "",
                note="each admitted run's entry and its reservation in flight; sampled once a second",
            )
    fig(f"bench process CPU ({server_side} + fake API)", [r.bench_cpu for r in results], "")
    fig(
        "host load average (1 min) at start",
        [r.load[0] for r in results],
        "",
        note="start → end: " + ", ".join(f"{r.load[0]:.1f} → {r.load[1]:.1f}" for r in results),
    )
    fig(
        "runs executed by two replicas at once",
        [float(r.concurrent) for r in results],
        "",
        Target(0.0),
        note="model requests of both in flight together",
    )
    fig(
        "runs whose AgentRun two replicas wrote",
        [float(r.written_by_two) for r in results],
        "",
        note="one after the other when a run moved",
    )
    fig(
        "replicas fencing themselves (Lease renewal too late)",
        [float(r.fences) for r in results],
        "",
        Target(0.0),
        note="each stops and hands back every run it executes",
    )
    rescaled = [r.rescale for r in results if r.rescale is not None]
    fig(
        "model requests repeated, iteration in flight",
        [float(r.repeats.in_flight) for r in results],
        "",
        # A graceful handoff lets the run reach its next checkpoint first: nothing to repeat.
        Target(0.0) if rescaled else None,
        note="a replica handing its runs over gracefully"
        if rescaled
        else "its answer lost with the replica that asked",
    )
    fig(
        "model requests repeated, iteration already checkpointed",
        [float(r.repeats.checkpointed) for r in results],
        "",
        Target(0.0),
        note="the run had gone on to the next iteration",
    )
    failovers = [r.failover for r in results if r.failover is not None]
    if failovers:
        section.add(
            Figure(
                f"{prefix}: runs of the SIGKILLed replica",
                median([float(f.moved) for f in failovers]),
                "",
                len(failovers),
                note=f"{failovers[-1].killed}: its unfinished runs at the kill",
            )
        )
        section.add(
            Figure(
                f"{prefix}: of those, finished elsewhere",
                median([float(f.moved_finished) for f in failovers]),
                "",
                len(failovers),
                Target(median([float(f.moved) for f in failovers]), at_most=False),
            )
        )
        regrouped = [f.regrouped for f in failovers if f.regrouped is not None]
        section.add(
            Figure(
                f"{prefix}: kill → every survivor applied the view without it",
                median(regrouped),
                "s",
                len(regrouped),
                note="membership's share: Lease expiry, new view, barrier",
            )
        )
        for name, q, target in (("p50", 50, None), ("max", 100, Target(lease + 5.0))):
            section.add(
                Figure(
                    f"{prefix}: kill → resumed on another replica {name}",
                    median([percentile(f.resume_delays, q) for f in failovers]),
                    "s",
                    len(failovers),
                    target,
                    note=f"Lease {lease} s" + (" + 5 s" if target else ""),
                )
            )
    for name, values, note in (
        ("scale-up: started → every replica applied the view of all", [x.joined for x in rescaled], ""),
        ("scale-down: SIGTERM → the leaving replicas exited", [x.left for x in rescaled], "runs handed over"),
        (
            "scale-down: SIGTERM → the first replica alone applied its view",
            [x.regrouped for x in rescaled],
            "",
        ),
    ):
        seen = [v for v in values if v is not None]
        if rescaled:
            section.add(
                Figure(f"{prefix}: {name}", median(seen) if seen else math.nan, "s", len(seen), note=note)
            )
    last = results[-1]
    rows = "\n".join(
        f"| {p.name} | {p.runs} | {p.iterations} | {p.cpu_seconds:.1f} | {p.cores:.2f} | "
        f"{_two(p.cpu_ms_per_iteration)} | {p.writes} | {_two(p.writes_per_iteration)} | {p.conflicts} | "
        f"{p.peak_rss_mib:.0f} |"
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
    killed = (
        "" if last.failover is None else f"; {last.failover.killed} SIGKILLed, its CPU counted until then"
    )
    section.details.append(
        f"**{prefix}, per replica** (last repeat; {settle}; wall time {last.makespan:.1f} s{killed}):\n\n"
        "| replica | runs | iterations | CPU s | cores busy | CPU ms per iteration | writes | "
        "writes per iteration | 409s | peak RSS MiB |\n| --- |" + " ---: |" * 9 + "\n"
        f"{rows}\n\nWrites per iteration by kind, all replicas: {writes}. Stored in the namespace after the "
        f"runs: {stored}."
    )
    for r in results:
        if r.unfinished:
            section.notes.append(
                f"{prefix}: {r.runs - r.finished} runs unfinished when the benchmark gave up after "
                f"{r.makespan:.0f} s (by phase: {r.unfinished}); time to finish is then that time."
            )
        if r.failover is not None and len(r.failover.resume_delays) < r.failover.moved:
            section.notes.append(
                f"{prefix}: {r.failover.moved - len(r.failover.resume_delays)} runs of the SIGKILLed "
                "replica never resumed on another replica."
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
    kill_after: float | None = None,
    rescale: tuple[float, float] | None = None,
    kubeconfig: Path | None = None,
) -> None:
    """``kubeconfig``: on that real API server, through the recording proxy, instead of the emulator."""
    ideal = MODEL_REQUESTS * latency
    serving = emulated() if kubeconfig is None else real(kubeconfig, workdir)
    where = "emulator" if kubeconfig is None else "real API server"
    for count in counts:
        progress(f"replicas ({where}): {runs} runs on {count} replica(s) × {repeats} repeats")
        results = [
            await one_run(
                workdir,
                serving,
                count,
                runs,
                latency,
                f"replicas-{count}-{runs}-{r}",
                lease_seconds=lease_seconds,
                quota=quota,
                kill_after=kill_after,
                rescale=rescale,
            )
            for r in range(repeats)
        ]
        report(
            section,
            results,
            ideal=ideal,
            lease=lease_seconds or DEFAULT_LEASE_SECONDS,
            server_side="emulator" if kubeconfig is None else "proxy",
        )
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
    if kill_after is not None:
        section.notes.append(
            f"replica-{KILLED} was SIGKILLed {kill_after:g} s after the last run was created. Its runs are "
            "the unfinished ones it owned under the view before the kill (rendezvous hashing, as the "
            "replicas compute it); each resumed when another replica sent its first model request (or "
            "wrote its terminal status, when no request was left). The survivors see the kill only when "
            "the killed replica's Lease expires, so the failover takes the Lease duration after its last "
            "renewal, plus the handoff barrier."
        )
    if rescale is not None:
        up, down = rescale
        section.notes.append(
            f"Only replica-0 ran when the runs were created; the others were started {up:g} s after "
            f"creation and sent SIGTERM {down:g} s after it (a scale 1 → N → 1 during the load). Each "
            "leaving replica hands its runs over at their next checkpoint, so no model request should be "
            "repeated; its CPU counts until it exited."
        )
    section.notes.append(
        "Every replica is a separate `agentrun operator` process on this machine, sharing its cores with "
        f"the others and with the {'emulator' if kubeconfig is None else 'API server, etcd, the proxy'} "
        "and the fake Messages API; CPU per iteration is the replicas' CPU from the first creation to the "
        "last terminal status write ÷ the iterations they ran. Writes include each replica's Lease "
        "renewals. Runs per replica: who wrote the terminal status."
    )
