"""Benchmark 4: bytes the operator writes to the API server per iteration, early and late in a long run.

One AgentRun of N calculator turns (each reply carries ~1.5 KB of text, so the transcript grows by a few KB
per iteration) runs on the real operator against the emulator, with no model latency. Iteration i spans
from the arrival of model request i to the arrival of request i+1 at the fake Messages API; its bytes are
the request bodies of every write (status patches, transcript objects, whatever the operator sends) that
reached the emulator in that span. A store that rewrote the whole transcript would grow linearly here.
The operator runs with AGENTRUN_STATUS_INTERVAL_SECONDS=0 (progress in status after every iteration, the
worst case), so every iteration makes the same writes and their sizes compare like for like.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import time
from dataclasses import dataclass
from pathlib import Path

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from bench.cluster import agentrun_manifest, create_runs, running_stack
from bench.conversation import API_KEY, MODEL
from bench.figures import Figure, Section, Target, median, progress

MARKER = "[bench:checkpoint]"
FILLER = "The intermediate reasoning of a long agent run, kept in the transcript. " * 20  # ~1.5 KB


def long_script(iterations: int) -> Script:
    steps = [
        Reply(
            [text_block(f"Step {turn}. {FILLER}"), tool_use_block("calculator", {"expression": f"{turn}+1"})],
            usage=ScriptUsage(500, 400),
        )
        for turn in range(iterations)
    ]
    steps.append(Reply([text_block("Finished the long run.")], usage=ScriptUsage(500, 5)))
    return Script(MARKER, steps)


@dataclass(frozen=True)
class LongRun:
    bytes_per_iteration: list[int]
    """Index i holds iteration i+1."""
    writes_per_iteration: list[int]
    kinds: dict[str, int]
    """Total write bytes by request kind over the whole run."""


async def one_run(workdir: Path, iterations: int, label: str) -> LongRun:
    api = FakeMessagesAPI(scripts=[long_script(iterations)], demo_brain=False)
    async with (
        api.running() as server,
        running_stack(
            workdir,
            model_url=server.url,
            api_key=API_KEY,
            max_concurrent_runs=10,
            label=label,
            # Worst case: progress in status after every iteration, so each one writes the same kinds.
            env={"AGENTRUN_STATUS_INTERVAL_SECONDS": "0"},
        ) as stack,
    ):
        manifest = agentrun_manifest(
            "long-run",
            f"{MARKER} {label}: add one, {iterations} times, with the calculator.",
            model={"name": MODEL, "maxTokens": 2048},
            tools=[{"builtin": {"name": "calculator"}}],
            limits={"maxIterations": iterations + 5, "timeoutSeconds": 3600},
        )
        await create_runs(stack.kube.url, [manifest])
        deadline = time.monotonic() + 120 + iterations
        while "long-run" not in stack.emulator.finished_at and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if "long-run" not in stack.emulator.finished_at:
            raise RuntimeError(f"the long run did not finish; see {stack.operator.log_path}")
        await asyncio.sleep(0.5)  # let the last writes (the terminal Event) land
        writes = [t for t in stack.emulator.timed if t.is_write and not t.from_bench]
    arrivals = [r.arrived_at for r in api.requests]
    if len(arrivals) != iterations + 1:
        raise RuntimeError(f"expected {iterations + 1} model requests, got {len(arrivals)}")
    sizes = [0] * iterations
    counts = [0] * iterations
    kinds: collections.Counter[str] = collections.Counter()
    for write in writes:
        kinds[write.kind] += write.size
        index = bisect.bisect_right(arrivals, write.at) - 1
        if 0 <= index < iterations:
            sizes[index] += write.size
            counts[index] += 1
    return LongRun(sizes, counts, dict(kinds))


async def measure(
    section: Section, workdir: Path, *, iterations: int, marks: list[int], repeats: int
) -> None:
    progress(f"checkpoint: {repeats} runs of {iterations} iterations")
    runs = [await one_run(workdir, iterations, f"checkpoint-{r}") for r in range(repeats)]
    for mark in marks:
        section.add(
            Figure(
                f"bytes written in iteration {mark}",
                median([r.bytes_per_iteration[mark - 1] for r in runs]),
                "B",
                repeats,
                note=f"{median([r.writes_per_iteration[mark - 1] for r in runs]):g} writes",
            )
        )
    first, last = marks[0], marks[-1]
    section.add(
        Figure(
            f"growth: iteration {last} ÷ iteration {first}",
            median(
                [r.bytes_per_iteration[last - 1] / max(r.bytes_per_iteration[first - 1], 1) for r in runs]
            ),
            "×",
            repeats,
            Target(1.10),
            note="flat = 1",
        )
    )
    rows = "\n".join(
        f"| {kind} | {size:,} |" for kind, size in sorted(runs[-1].kinds.items(), key=lambda kv: -kv[1])
    )
    section.details.append(
        f"**Bytes written over the whole {iterations}-iteration run, by request kind** (last repeat):\n\n"
        f"| request | bytes |\n| --- | --- |\n{rows}"
    )
    section.notes.append(
        f"Each model reply carries ~{len(FILLER) // 100 * 100} characters of text plus a calculator call, "
        "so the "
        f"transcript is ~{iterations * 1.7:.0f} KB by iteration {iterations}. 'Flat' is read as iteration "
        f"{last} writing at most 10% more than iteration {first} (status counters grow by a few digits)."
    )
