"""Benchmark 3: N concurrent AgentRuns on one operator process against the Kubernetes API emulator.

Each run is 5 model requests (4 calculator turns, then an answer) with 1 s model latency, so an operator
that added nothing would finish all of them 5 s after the first one is created. The emulator and the fake
Messages API run in this process; CPU time of both processes is sampled to name the bottleneck.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import pstats
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no stubs in the dev group

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from bench import sdk_floor
from bench.cluster import (
    OperatorProcess,
    TimedRequest,
    agentrun_manifest,
    create_runs,
    running_operator,
    running_stack,
)
from bench.conversation import API_KEY, MODEL
from bench.figures import Figure, Section, Target, median, percentile, progress
from bench.profiles import cumulative, summarise
from bench.real_server import ProxiedRequest, prepared

MARKER = "[bench:scale]"
MODEL_REQUESTS = 5


#: Code paths whose cumulative time the operator profile reports (file suffix : function).
HOT_PATHS = {
    "one model request (adapter + SDK + HTTP transport)": "model/anthropic_calling.py:complete",
    "stream accumulation (StreamedMessage.add, streamed requests only)": "model/streaming.py:add",
    "httpcore2 pool (httpx transport only): assigning requests to connections": (
        "connection_pool.py:_assign_requests_to_connections"
    ),
    "status writes (StatusWriter._patch)": "controller/agentruns/status_writing.py:_patch",
    "Kopf: processing one watch event for one object": (
        "kopf/_core/reactor/processing.py:process_resource_event"
    ),
    "Kopf: on.event handler invocations": "kopf/_core/actions/execution.py:execute_handlers_once",
    "logging (format + write)": "logging/__init__.py:handle",
    "JSON log formatting": "agentrun/logs.py:format",
}


def scale_script() -> Script:
    steps = [
        Reply(
            [text_block("Computing."), tool_use_block("calculator", {"expression": f"{turn}*7+1"})],
            usage=ScriptUsage(300, 30),
        )
        for turn in range(MODEL_REQUESTS - 1)
    ]
    steps.append(Reply([text_block("Done.")], usage=ScriptUsage(500, 5)))
    return Script(MARKER, steps)


@dataclass(frozen=True)
class ScaleRun:
    runs: int
    makespan: float
    create_burst: float
    first_request_latencies: list[float]
    requests_per_iteration: float
    writes_per_iteration: float
    write_kib_per_iteration: float
    """Request bodies of the operator's writes per iteration (KiB): what it hands the API server, and
    so etcd, to store; the transcript's share of it goes elsewhere with a database store."""
    peak_rss_mib: float
    operator_cpu: float
    """Cores the operator used on average (CPU seconds ÷ wall seconds)."""
    cpu_ms_per_iteration: float
    """Operator CPU time per model iteration, creation to last finish."""
    bench_cpu: float
    """Cores this process (emulator + fake Messages API + driver) used on average."""
    succeeded: int
    turn_gaps: list[float]
    """Per run and iteration: next model request arrival − (previous arrival + model latency), i.e. the time
    the operator spent between a model response and its next request."""
    breakdown: dict[str, float]
    """Operator requests per iteration, by kind."""
    run_lengths: list[float]
    """Per run: first model request → last answer (the last request's arrival + model latency)."""
    load: tuple[float, float] = (0.0, 0.0)
    """The host's 1-minute load average when the creations started and when the last run finished."""
    write_latencies: list[float] = field(default_factory=list)
    """Real server only: seconds from each operator write reaching the proxy to the server's answer."""


async def one_run(
    workdir: Path, runs: int, latency: float, label: str, *, profile_path: Path | None = None
) -> ScaleRun:
    api = FakeMessagesAPI(scripts=[scale_script()], latency_seconds=latency, demo_brain=False)
    me = psutil.Process()
    async with (
        api.running() as server,
        running_stack(
            workdir,
            model_url=server.url,
            api_key=API_KEY,
            max_concurrent_runs=max(runs, 1000),
            label=label,
            profile_path=profile_path,
        ) as stack,
    ):
        manifests = scale_manifests(runs)
        emulator = stack.emulator
        log_start = len(emulator.timed)
        stack.operator.start_profiling()
        cpu_op_0, cpu_me_0 = stack.sampler.cpu_seconds(), _cpu(me)
        started = time.time()
        created = await create_runs(stack.kube.url, manifests)
        create_burst = time.time() - started
        deadline = time.monotonic() + 120 + runs * 0.5
        while len(emulator.finished_at) < runs and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        wall = time.time() - started
        cpu_op, cpu_me = stack.sampler.cpu_seconds() - cpu_op_0, _cpu(me) - cpu_me_0
        peak = stack.sampler.peak_rss
        objects = emulator.list_objects("agentruns", "default")
        if len(emulator.finished_at) < runs:
            raise RuntimeError(
                f"only {len(emulator.finished_at)} of {runs} runs finished; see {stack.operator.log_path}"
            )
        end = max(emulator.finished_at.values())
        window = [t for t in emulator.timed[log_start:] if not t.from_bench and t.at <= end]
    return _scale_run(
        runs,
        objects,
        window,
        api,
        latency=latency,
        started=started,
        end=end,
        create_burst=create_burst,
        created=created,
        peak=peak,
        cpu_op=cpu_op,
        cpu_me=cpu_me,
        wall=wall,
    )


def _scale_run(
    runs: int,
    objects: list[dict[str, Any]],
    window: Sequence[TimedRequest | ProxiedRequest],
    api: FakeMessagesAPI,
    *,
    latency: float,
    started: float,
    end: float,
    create_burst: float,
    created: dict[str, float],
    peak: int,
    cpu_op: float,
    cpu_me: float,
    wall: float,
    load: tuple[float, float] = (0.0, 0.0),
    write_latencies: list[float] | None = None,
) -> ScaleRun:
    """The figures of one repeat from what either server recorded: the runs' objects, the operator's
    requests in the measured window, and the model requests the fake API saw."""
    succeeded = sum(1 for o in objects if o.get("status", {}).get("phase") == "Succeeded")
    iterations = sum(int(o.get("status", {}).get("iterations") or 0) for o in objects)
    arrivals: dict[str, list[float]] = collections.defaultdict(list)
    for request in api.requests:
        arrivals["scale-" + request.first_user_text.split("run-", 1)[1][:5]].append(request.arrived_at)
    first_arrival = {name: times[0] for name, times in arrivals.items()}
    kinds = collections.Counter(t.kind for t in window)
    per_iteration = max(iterations, 1)
    return ScaleRun(
        runs=runs,
        makespan=end - started,
        create_burst=create_burst,
        first_request_latencies=[first_arrival[n] - created[n] for n in created if n in first_arrival],
        requests_per_iteration=len(window) / per_iteration,
        writes_per_iteration=sum(1 for t in window if t.is_write) / per_iteration,
        write_kib_per_iteration=sum(t.size for t in window if t.is_write) / per_iteration / 1024,
        peak_rss_mib=peak / 2**20,
        operator_cpu=cpu_op / wall,
        cpu_ms_per_iteration=cpu_op / per_iteration * 1000,
        bench_cpu=cpu_me / wall,
        succeeded=succeeded,
        turn_gaps=[b - a - latency for times in arrivals.values() for a, b in itertools.pairwise(times)],
        breakdown={kind: count / per_iteration for kind, count in kinds.most_common()},
        run_lengths=[times[-1] - times[0] + latency for times in arrivals.values()],
        load=load,
        write_latencies=write_latencies if write_latencies is not None else [],
    )


def scale_manifests(runs: int, prefix: str = "scale") -> list[dict[str, Any]]:
    """The runs of the scale workload: named ``<prefix>-00000`` on; the fake model tells them apart by
    the ``run-00000`` in the task."""
    return [
        agentrun_manifest(
            f"{prefix}-{i:05d}",
            f"{MARKER} run-{i:05d}: compute four small products with the calculator.",
            model={"name": MODEL, "maxTokens": 512},
            tools=[{"builtin": {"name": "calculator"}}],
        )
        for i in range(runs)
    ]


async def one_real_run(
    workdir: Path,
    runs: int,
    latency: float,
    label: str,
    kubeconfig: Path,
    *,
    profile_path: Path | None = None,
) -> ScaleRun:
    """The same workload on the real API server of ``kubeconfig``, in a namespace of its own.

    The operator serves only that namespace (``--namespace``) and reaches the server through the
    recording proxy (:mod:`bench.real_server`), so its requests are counted exactly and the terminal
    status patches are timed as the emulator times them.
    """
    api = FakeMessagesAPI(scripts=[scale_script()], latency_seconds=latency, demo_brain=False)
    me = psutil.Process()
    async with (
        prepared(kubeconfig, workdir, f"realbench-scale-{os.getpid()}-{label}") as (server, namespace, proxy),
        api.running() as fake,
    ):
        operator = OperatorProcess(
            kubeconfig=proxy.kubeconfig(namespace),
            log_path=workdir / f"operator-{label}.log",
            env={"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": fake.url},
            args=("--max-concurrent-runs", str(max(runs, 1000)), "--namespace", namespace),
            profile_path=profile_path,
        )
        async with running_operator(operator, stop_timeout=60.0 if profile_path else 5.0) as sampler:
            log_start, write_start = len(proxy.requests), len(proxy.write_latencies)
            operator.start_profiling()
            cpu_op_0, cpu_me_0 = sampler.cpu_seconds(), _cpu(me)
            load_0 = os.getloadavg()[0]
            started = time.time()
            created = await server.create_runs(namespace, scale_manifests(runs))
            create_burst = time.time() - started
            deadline = time.monotonic() + 300 + runs * 0.5
            while len(proxy.finished_at) < runs and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            await _quiet(proxy.requests, seconds=2.0, timeout=30.0)
            wall = time.time() - started
            cpu_op, cpu_me = sampler.cpu_seconds() - cpu_op_0, _cpu(me) - cpu_me_0
            load_1 = os.getloadavg()[0]
            peak = sampler.peak_rss
        if len(proxy.finished_at) < runs:
            raise RuntimeError(
                f"only {len(proxy.finished_at)} of {runs} runs finished; see {operator.log_path}"
            )
        objects = await server.runs(namespace)
    # Everything from the first creation until the operator fell quiet: a run's finished Event follows
    # its terminal status patch, so cutting at the last of those would leave the last runs' Events out.
    return _scale_run(
        runs,
        objects,
        proxy.requests[log_start:],
        api,
        latency=latency,
        started=started,
        end=max(proxy.finished_at.values()),
        create_burst=create_burst,
        created=created,
        peak=peak,
        cpu_op=cpu_op,
        cpu_me=cpu_me,
        wall=wall,
        load=(load_0, load_1),
        write_latencies=proxy.write_latencies[write_start:],
    )


async def _quiet(requests: list[ProxiedRequest], *, seconds: float, timeout: float) -> None:
    """Until no write has reached the proxy for ``seconds`` (at most ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = next((r.at for r in reversed(requests) if r.is_write), 0.0)
        if time.time() - last >= seconds:
            return
        await asyncio.sleep(0.2)


def _report_size(
    section: Section,
    runs: int,
    results: list[ScaleRun],
    *,
    ideal: float,
    targeted: bool,
    server_side: str = "emulator",
) -> None:
    """Medians over the repeats of one size; targets are judged at the largest size only."""

    def fig(name: str, values: list[float], unit: str, target: Target | None = None, note: str = "") -> None:
        figure = Figure(
            f"{runs} runs: {name}", median(values), unit, len(results), target if targeted else None, note
        )
        section.add(figure)

    fig(
        "time to finish all ÷ ideal",
        [r.makespan / ideal for r in results],
        "×",
        Target(1.25),
        note=f"ideal {ideal:g} s",
    )
    fig(
        "create → first model request p50",
        [percentile(r.first_request_latencies, 50) for r in results],
        "s",
    )
    fig(
        "create → first model request p99",
        [percentile(r.first_request_latencies, 99) for r in results],
        "s",
        Target(2.0),
    )
    fig("API requests per iteration", [r.requests_per_iteration for r in results], "")
    fig("API writes per iteration", [r.writes_per_iteration for r in results], "", Target(1.0))
    fig("API write bytes per iteration", [r.write_kib_per_iteration for r in results], "KiB")
    fig("operator peak RSS", [r.peak_rss_mib for r in results], "MiB", Target(1024.0))
    fig("operator time between response and next request p50", [median(r.turn_gaps) for r in results], "s")
    fig(
        "operator time between response and next request p90",
        [percentile(r.turn_gaps, 90) for r in results],
        "s",
    )
    fig("operator CPU (cores busy)", [r.operator_cpu for r in results], "")
    fig("operator CPU per iteration", [r.cpu_ms_per_iteration for r in results], "ms", Target(1.5))
    fig(f"bench process CPU ({server_side} + fake API)", [r.bench_cpu for r in results], "")
    fig("creation burst", [r.create_burst for r in results], "s")
    fig(
        "run length p50 (first model request → last answer)",
        [percentile(r.run_lengths, 50) for r in results],
        "s",
        note=f"ideal {ideal:g} s",
    )


def _writes_note(runs: int, result: ScaleRun) -> str:
    kinds = result.breakdown
    parts = ", ".join(
        f"{kind} {kinds[kind]:.2f}"
        for kind in ("PATCH agentruns/status", "POST secrets", "POST events", "PATCH agentruns")
        if kind in kinds
    )
    return (
        f"{runs} runs: writes per iteration by kind: {parts}. With {MODEL_REQUESTS} iterations per run, "
        "each write made once per run (the Running and terminal status patches, the finished Event) "
        f"adds 1/{MODEL_REQUESTS} = 0.2 per iteration. Progress reaches status at most "
        "every AGENTRUN_STATUS_INTERVAL_SECONDS (10 s), on a timer: the median run here took "
        f"{percentile(result.run_lengths, 50):.1f} s from its first model request to its last answer, "
        "and every 10 s of that adds a status patch of its own."
    )


def _analyse(section: Section, runs: int, results: list[ScaleRun], ideal: float) -> None:
    """Name the bottleneck from the numbers: which process was busy, and what its CPU cost implies."""
    op_cpu = median([r.operator_cpu for r in results])
    bench_cpu = median([r.bench_cpu for r in results])
    per_iteration_ms = median([r.cpu_ms_per_iteration for r in results])
    floor = per_iteration_ms / 1000 * runs * MODEL_REQUESTS
    makespan = median([r.makespan for r in results])
    busy = "the operator process" if op_cpu >= bench_cpu else "the benchmark process (server side + fake API)"
    section.notes.append(_writes_note(runs, results[-1]))
    section.notes.append(
        f"{runs} runs: the busier process was {busy} ({op_cpu:.2f} vs {bench_cpu:.2f} cores on average). "
        f"The operator used {per_iteration_ms:.1f} ms of CPU per iteration; on one event loop "
        f"{runs} × {MODEL_REQUESTS} iterations need at least {floor:.1f} s of that single core, against an "
        f"ideal makespan of {ideal:g} s (measured: {makespan:.1f} s)."
    )


def _report_outcome(
    section: Section, runs: int, results: list[ScaleRun], ideal: float, *, last_repeat: str
) -> None:
    """What every size reports on either server: runs that failed, requests by kind, the bottleneck."""
    failed = [r.runs - r.succeeded for r in results]
    if any(failed):
        section.notes.append(f"{runs} runs: runs not Succeeded per repeat: {failed} (see the operator logs)")
    rows = "\n".join(f"| {kind} | {value:.2f} |" for kind, value in results[-1].breakdown.items())
    section.details.append(
        f"**{runs} runs, operator requests per iteration by kind** ({last_repeat}):\n\n"
        f"| request | per iteration |\n| --- | --- |\n{rows}"
    )
    _analyse(section, runs, results, ideal)


def _profile(path: Path, heading: str) -> str:
    stats = pstats.Stats(str(path))
    return f"{heading}:\n\n" + summarise(stats) + "\n\n" + cumulative(stats, HOT_PATHS)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def measure(
    section: Section,
    workdir: Path,
    *,
    sizes: list[int],
    repeats: int,
    latency: float,
    profile_size: int | None,
    kubeconfig: Path | None = None,
) -> None:
    """``kubeconfig``: on that real API server (through the recording proxy) instead of the emulator."""
    ideal = MODEL_REQUESTS * latency
    largest = max(sizes)
    if kubeconfig is not None:
        await _measure_real(section, workdir, kubeconfig, sizes, repeats, latency, profile_size)
        return
    for runs in sizes:
        progress(f"scale: {runs} runs × {repeats} repeats")
        results = [await one_run(workdir, runs, latency, f"scale-{runs}-{r}") for r in range(repeats)]
        progress(f"scale: bare SDK floor for {runs} runs × {repeats} repeats")
        floors = [
            await sdk_floor.measure(
                scale_script(), MARKER, runs=runs, requests=MODEL_REQUESTS, latency=latency
            )
            for _ in range(repeats)
        ]
        _report_size(section, runs, results, ideal=ideal, targeted=runs == largest)
        section.add(
            Figure(
                f"{runs} runs: bare SDK floor, time ÷ ideal",
                median([f.makespan / ideal for f in floors]),
                "×",
                repeats,
                note="same traffic, no operator",
            )
        )
        section.add(
            Figure(
                f"{runs} runs: bare SDK floor, CPU per model request",
                median([f.cpu_ms_per_request for f in floors]),
                "ms",
                repeats,
            )
        )
        _report_outcome(section, runs, results, ideal, last_repeat="last repeat")
    if profile_size:
        progress(f"scale: profiling the operator over {profile_size} runs")
        path = workdir / f"operator-{profile_size}.prof"
        await one_run(workdir, profile_size, latency, f"profile-{profile_size}", profile_path=path)
        section.details.append(
            _profile(
                path,
                f"**Profile of the operator process** (cProfile with a CPU-time clock, one extra untimed run "
                f"of {profile_size} runs, from the first creation to the operator's exit; startup left out)",
            )
        )
    section.notes.append(
        f"Targets apply to the largest size ({largest} runs). Time to finish is measured from the first "
        "creation request to the last terminal status write, so it includes the creation burst. "
        "Requests per iteration count only the operator's requests (not the benchmark's creations)."
    )


async def _measure_real(
    section: Section,
    workdir: Path,
    kubeconfig: Path,
    sizes: list[int],
    repeats: int,
    latency: float,
    profile_size: int | None,
) -> None:
    """The figures of :func:`measure` on a real server, plus the host load beside each repeat.

    No bare-SDK floor here: it does not touch Kubernetes, so the emulator section measures it already.
    """
    ideal = MODEL_REQUESTS * latency
    largest = max(sizes)
    for runs in sizes:
        progress(f"scale (real API server): {runs} runs × {repeats} repeats")
        results = [
            await one_real_run(workdir, runs, latency, f"{runs}-{r}", kubeconfig) for r in range(repeats)
        ]
        _report_size(section, runs, results, ideal=ideal, targeted=runs == largest, server_side="proxy")
        for q in (50, 99):
            section.add(
                Figure(
                    f"{runs} runs: operator API write latency p{q} (proxy → server → proxy)",
                    median([percentile(r.write_latencies, q) for r in results]),
                    "s",
                    repeats,
                )
            )
        loads = ", ".join(f"{r.load[0]:.1f} → {r.load[1]:.1f}" for r in results)
        section.add(
            Figure(
                f"{runs} runs: host load average (1 min) at start",
                median([r.load[0] for r in results]),
                "",
                repeats,
                note=f"start → end per repeat: {loads}",
            )
        )
        _report_outcome(section, runs, results, ideal, last_repeat="last repeat, counted by the proxy")
    if profile_size:
        progress(f"scale (real API server): profiling the operator over {profile_size} runs")
        path = workdir / f"operator-real-{profile_size}.prof"
        await one_real_run(
            workdir, profile_size, latency, f"profile-{profile_size}", kubeconfig, profile_path=path
        )
        section.details.append(
            _profile(
                path,
                f"**Profile of the operator process against the real server** (cProfile, CPU-time clock, one "
                f"extra untimed run of {profile_size} runs)",
            )
        )
    section.notes.append(
        f"Targets apply to the largest size ({largest} runs). The operator reaches the server through a "
        "recording TLS proxy in the benchmark process, which counts its requests exactly (the server's own "
        "counters have no per-client label, and other clients write to a shared server at the same time); "
        "the benchmark process CPU includes that proxy. Time to finish runs from the first creation "
        "request to the last terminal status write; requests, writes and operator CPU are counted from "
        "the first creation until no operator write for 2 s after it (the last runs' finished Events "
        "included)."
    )
