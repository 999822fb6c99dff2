"""``python -m bench``: runs the benchmarks, prints the table, writes the results file."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import (
    checkpoint_cost,
    console_pages,
    long_context,
    loop_overhead,
    operator_scale,
    parallel_tools,
    real_server,
    replica_scale,
)
from bench.cluster import operator_settings
from bench.figures import Section
from bench.machine import describe
from bench.reporting import markdown, merge, table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
BENCHMARKS = ("loop", "parallel", "scale", "checkpoint", "context", "replicas", "console")


@dataclass(frozen=True)
class Plan:
    loop_rounds: int
    loop_turns: int = 10
    loop_calls: int = 3
    parallel_repeats: int = 10
    parallel_calls: int = 8
    parallel_seconds: float = 0.2
    scale_sizes: tuple[int, ...] = (100, 500, 1000)
    scale_repeats: int = 3
    latency: float = 1.0
    profile_size: int | None = 100
    checkpoint_iterations: int = 200
    checkpoint_marks: tuple[int, ...] = (5, 50, 200)
    checkpoint_repeats: int = 3
    context_iterations: int = 200
    replica_counts: tuple[int, ...] = (1, 2, 4)
    replica_runs: int = 1000
    replica_repeats: int = 1
    replica_lease_seconds: int | None = None
    replica_quota: bool = False
    replica_kill: float | None = None
    replica_rescale: tuple[float, float] | None = None
    console_turns: int = 500
    console_result_bytes: int = 20_000
    console_repeats: int = 5
    console_list_runs: int = 10_000


FULL = Plan(loop_rounds=30)
QUICK = Plan(
    loop_rounds=3,
    parallel_repeats=2,
    scale_sizes=(10, 20),
    scale_repeats=1,
    profile_size=None,
    checkpoint_iterations=20,
    checkpoint_marks=(2, 5, 20),
    checkpoint_repeats=1,
    context_iterations=60,
    replica_counts=(1, 2),
    replica_runs=20,
    console_turns=100,
    console_repeats=3,
    console_list_runs=1000,
)
SMOKE = Plan(
    loop_rounds=1,
    parallel_repeats=1,
    scale_sizes=(3,),
    scale_repeats=1,
    latency=0.2,
    profile_size=3,
    checkpoint_iterations=6,
    checkpoint_marks=(2, 6),
    checkpoint_repeats=1,
    context_iterations=12,
    replica_counts=(1, 2),
    replica_runs=4,
    console_turns=5,
    console_result_bytes=3000,
    console_repeats=1,
    console_list_runs=60,
)
"""The smallest plan that still takes every code path, the profiled operator included: CI runs it so a
broken harness fails a test, and its figures mean nothing."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes and few repeats: a quick look")
    size.add_argument(
        "--smoke",
        action="store_true",
        help="the smallest sizes, one repeat each: checks that every benchmark still runs "
        "(CI runs it; its figures are meaningless)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these benchmarks ({', '.join(BENCHMARKS)}); repeatable or comma-separated",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="Markdown results file (default: bench/RESULTS.md for a full run, else a temp file)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="replace only this run's sections (and their targets) in an existing results file, "
        "default bench/RESULTS.md, keeping the others: e.g. --only replicas --merge",
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="operator logs and profiles (default: temp)"
    )
    parser.add_argument("--seed", type=int, default=8, help="seed of the contender order shuffle")
    parser.add_argument("--scale-sizes", default=None, help="comma-separated run counts, e.g. 100,500,1000")
    parser.add_argument("--scale-repeats", type=int, default=None, help="repeats per scale size")
    parser.add_argument(
        "--latency", type=float, default=None, help="model latency of the scale benchmark (s)"
    )
    parser.add_argument("--loop-rounds", type=int, default=None, help="rounds of the loop benchmark")
    parser.add_argument("--checkpoint-iterations", type=int, default=None, help="length of the long run")
    parser.add_argument(
        "--context-iterations", type=int, default=None, help="length of the long-context run (default 200)"
    )
    parser.add_argument(
        "--profile-size", type=int, default=None, help="runs in the profiled scale run (0: none)"
    )
    parser.add_argument(
        "--replica-counts",
        type=_counts,
        default=None,
        help="comma-separated replica counts, e.g. 1,2,4 (default 1,2,4)",
    )
    parser.add_argument("--replica-runs", type=_positive, default=None, help="runs of the replica benchmark")
    parser.add_argument("--replica-repeats", type=_positive, default=None, help="repeats per replica count")
    parser.add_argument(
        "--lease-duration",
        type=_positive,
        default=None,
        help="AGENTRUN_LEASE_DURATION_SECONDS of the replicas (default: the operator's default)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="run the scale and replica benchmarks (--only scale and/or replicas) on the real API server "
        "of this kubeconfig instead of the emulator: CRDs applied, runs in a fresh namespace (deleted "
        "afterwards), every operator process counted through a recording TLS proxy; their sections' "
        "titles say 'real API server'",
    )
    parser.add_argument(
        "--transcript-store",
        choices=("secret", "postgres"),
        default="secret",
        help="where the operators of the scale and replica benchmarks keep transcripts: Secrets (the "
        "default) or a real PostgreSQL server the benchmark starts (Debian's postgresql); the sections' "
        "titles name a PostgreSQL store",
    )
    parser.add_argument(
        "--operator-setting",
        action="append",
        type=_setting,
        default=[],
        metavar="AGENTRUN_NAME=VALUE",
        help="an operator setting every operator process of the run gets (repeatable), e.g. "
        "AGENTRUN_MODEL_CLIENT=sdk to compare",
    )
    parser.add_argument(
        "--replica-quota",
        action="store_true",
        help="the replica benchmark with a namespace AgentRunQuota no run reaches (ledger write load)",
    )
    parser.add_argument(
        "--replica-kill",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="SIGKILL one replica (replica-1) this many seconds after the runs are created and report "
        "the failover; every --replica-counts must then be at least 2",
    )
    parser.add_argument(
        "--replica-rescale",
        type=_rescale,
        default=None,
        metavar="UP,DOWN",
        help="scale 1 → N → 1 during the load: only replica-0 runs at first, the other N-1 start UP "
        "seconds after the runs are created and get SIGTERM DOWN seconds after it (UP < DOWN); every "
        "--replica-counts must then be at least 2",
    )
    return parser


def _rescale(text: str) -> tuple[float, float]:
    up, _, down = text.partition(",")
    times = (_seconds(up.strip()), _seconds(down.strip()))
    if times[0] >= times[1]:
        raise argparse.ArgumentTypeError(f"UP must come before DOWN, got {text!r}")
    return times


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("AGENTRUN_"):
        raise argparse.ArgumentTypeError(f"{text!r} is not AGENTRUN_NAME=VALUE")
    return name, value


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be finite and at least 0")
    return value


def _counts(text: str) -> tuple[int, ...]:
    """``1,2,4`` → (1, 2, 4); argparse turns the error into one line naming the option."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be at least 1")
    return counts


def _plan(args: argparse.Namespace) -> Plan:
    plan = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.scale_sizes:
        plan = dataclasses.replace(plan, scale_sizes=tuple(int(x) for x in args.scale_sizes.split(",")))
    if args.scale_repeats is not None:
        plan = dataclasses.replace(plan, scale_repeats=args.scale_repeats)
    if args.latency is not None:
        plan = dataclasses.replace(plan, latency=args.latency)
    if args.loop_rounds is not None:
        plan = dataclasses.replace(plan, loop_rounds=args.loop_rounds)
    if args.checkpoint_iterations is not None:
        n = args.checkpoint_iterations
        marks = tuple(sorted({m for m in (2, 5, 50, 200) if m < n} | {n}))
        plan = dataclasses.replace(plan, checkpoint_iterations=n, checkpoint_marks=marks)
    if args.context_iterations is not None:
        plan = dataclasses.replace(plan, context_iterations=args.context_iterations)
    if args.replica_counts:
        plan = dataclasses.replace(plan, replica_counts=args.replica_counts)
    if args.replica_runs is not None:
        plan = dataclasses.replace(plan, replica_runs=args.replica_runs)
    if args.replica_repeats is not None:
        plan = dataclasses.replace(plan, replica_repeats=args.replica_repeats)
    if args.lease_duration is not None:
        plan = dataclasses.replace(plan, replica_lease_seconds=args.lease_duration)
    if args.replica_quota:
        plan = dataclasses.replace(plan, replica_quota=True)
    if args.replica_kill is not None:
        plan = dataclasses.replace(plan, replica_kill=args.replica_kill)
    if args.replica_rescale is not None:
        plan = dataclasses.replace(plan, replica_rescale=args.replica_rescale)
    if args.profile_size is not None:
        plan = dataclasses.replace(plan, profile_size=args.profile_size or None)
    return plan


async def run(
    selected: Sequence[str], plan: Plan, workdir: Path, seed: int, kubeconfig: Path | None = None
) -> list[Section]:
    sections: list[Section] = []
    if "loop" in selected:
        section = Section("loop", "Loop overhead", _method(loop_overhead.__doc__))
        await loop_overhead.measure(
            section, rounds=plan.loop_rounds, turns=plan.loop_turns, calls=plan.loop_calls, seed=seed
        )
        sections.append(section)
    if "parallel" in selected:
        section = Section("parallel", "Parallel tools", _method(parallel_tools.__doc__))
        await parallel_tools.measure(
            section, repeats=plan.parallel_repeats, calls=plan.parallel_calls, seconds=plan.parallel_seconds
        )
        sections.append(section)
    if "scale" in selected:
        section = (
            Section("scale", "Operator at scale", _method(operator_scale.__doc__))
            if kubeconfig is None
            else Section("scale", "Operator at scale, real API server", _method(real_server.__doc__))
        )
        await operator_scale.measure(
            section,
            workdir,
            sizes=list(plan.scale_sizes),
            repeats=plan.scale_repeats,
            latency=plan.latency,
            profile_size=plan.profile_size,
            kubeconfig=kubeconfig,
        )
        sections.append(section)
    if "checkpoint" in selected:
        section = Section("checkpoint", "Checkpoint cost", _method(checkpoint_cost.__doc__))
        await checkpoint_cost.measure(
            section,
            workdir,
            iterations=plan.checkpoint_iterations,
            marks=list(plan.checkpoint_marks),
            repeats=plan.checkpoint_repeats,
        )
        sections.append(section)
    if "context" in selected:
        section = Section("context", "Long runs: context management", _method(long_context.__doc__))
        await long_context.measure(section, iterations=plan.context_iterations)
        sections.append(section)
    if "replicas" in selected:
        title = (
            "Replicas sharing the runs"
            + (", real API server" if kubeconfig is not None else "")
            + (", with a namespace quota" if plan.replica_quota else "")
            + (
                f", one replica SIGKILLed {plan.replica_kill:g} s after creation"
                if plan.replica_kill is not None
                else ""
            )
            + (", scaled 1 → N → 1 during the load" if plan.replica_rescale is not None else "")
        )
        section = Section("replicas", title, _method(replica_scale.__doc__))
        await replica_scale.measure(
            section,
            workdir,
            counts=list(plan.replica_counts),
            runs=plan.replica_runs,
            repeats=plan.replica_repeats,
            latency=plan.latency,
            lease_seconds=plan.replica_lease_seconds,
            quota=plan.replica_quota,
            kill_after=plan.replica_kill,
            rescale=plan.replica_rescale,
            kubeconfig=kubeconfig,
        )
        sections.append(section)
    if "console" in selected:
        section = Section("console", "Web console: big runs, long lists", _method(console_pages.__doc__))
        await console_pages.measure(
            section,
            turns=plan.console_turns,
            result_bytes=plan.console_result_bytes,
            repeats=plan.console_repeats,
            list_runs=plan.console_list_runs,
        )
        sections.append(section)
    return sections


async def _with_store(
    store: str, workdir: Path, measure: Callable[[], Coroutine[Any, Any, list[Section]]]
) -> list[Section]:
    """The benchmarks with their operators keeping transcripts in ``store``; a PostgreSQL server is
    started for them (and stopped after), the same real server the tests start."""
    if store == "secret":
        return await measure()
    from tests.support.postgres import running_postgres  # only for this store

    async with running_postgres(workdir / "postgres") as database:
        with operator_settings(
            {"AGENTRUN_TRANSCRIPT_STORAGE": "postgres", "AGENTRUN_DATABASE_URL": database.dsn}
        ):
            sections = await measure()
    for section in sections:
        if section.key in ("scale", "replicas"):
            section.title += ", transcripts in PostgreSQL"
    return sections


def _method(doc: str | None) -> str:
    """A benchmark module's docstring minus its first line: how the figure is measured."""
    text = (doc or "").strip()
    parts = text.split("\n\n", 1)
    return " ".join((parts[1] if len(parts) > 1 else parts[0]).split())


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    selected = [name.strip() for item in args.only for name in item.split(",") if name.strip()] or list(
        BENCHMARKS
    )
    unknown = sorted(set(selected) - set(BENCHMARKS))
    if unknown:
        print(f"error: unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    if args.kubeconfig is not None and (
        not set(selected) <= {"scale", "replicas"} or not args.kubeconfig.is_file()
    ):
        print(
            "error: --kubeconfig needs --only scale and/or replicas and an existing kubeconfig file"
            f" (got --only {','.join(selected)}, {args.kubeconfig})",
            file=sys.stderr,
        )
        return 2
    plan = _plan(args)
    if plan.replica_kill is not None and "replicas" in selected and min(plan.replica_counts) < 2:
        print(
            "error: --replica-kill needs at least 2 replicas in every --replica-counts"
            f" (got {','.join(map(str, plan.replica_counts))}): one is killed, another takes over",
            file=sys.stderr,
        )
        return 2
    if (
        plan.replica_rescale is not None
        and "replicas" in selected
        and (plan.replica_kill is not None or min(plan.replica_counts) < 2)
    ):
        print(
            "error: --replica-rescale needs at least 2 replicas in every --replica-counts and no "
            f"--replica-kill (got --replica-counts {','.join(map(str, plan.replica_counts))}"
            + (f", --replica-kill {plan.replica_kill:g}" if plan.replica_kill is not None else "")
            + ")",
            file=sys.stderr,
        )
        return 2
    partial = args.quick or args.smoke or bool(args.only)
    results: Path = args.results or (
        Path(tempfile.gettempdir()) / "agentrun-bench-RESULTS.md" if partial and not args.merge else RESULTS
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agentrun-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    machine = describe(ROOT)
    started = time.monotonic()
    with operator_settings(dict(args.operator_setting)):
        sections = asyncio.run(
            _with_store(
                args.transcript_store,
                workdir,
                lambda: run(selected, plan, workdir, args.seed, args.kubeconfig),
            )
        )
    command = "python -m bench" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    load = os.getloadavg()
    if args.merge and results.exists():
        text = merge(
            results.read_text(), sections, command=command.strip(), date=machine.date, commit=machine.commit
        )
    else:
        text = markdown(sections, machine, command=command.strip(), load_after=(load[0], load[1], load[2]))
    results.write_text(text)
    print(table(sections))
    print(
        f"Python speed of this host: {machine.reference_seconds * 1000:.0f} ms of one core for the reference "
        "work (bench/machine.py); CPU figures from two hosts compare in proportion to it"
    )
    print(f"\n{time.monotonic() - started:.0f} s; results: {results}; operator logs: {workdir}")
    return 0
