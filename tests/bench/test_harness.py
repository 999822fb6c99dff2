"""`python -m bench --smoke`: every benchmark of the harness still runs end to end and reports figures.

The smoke plan's sizes are too small to mean anything, so nothing here is judged on speed: a target
may pass or miss, but it must carry a number and a verdict.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "Loop overhead",
    "Parallel tools",
    "Operator at scale",
    "Checkpoint cost",
    "Long runs: context management",
    "Replicas sharing the runs",
    "Web console: big runs, long lists",
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
VERDICT = re.compile(r"pass|\*\*MISS \([^)]*\)\*\*")
RUN_SECONDS = 300

# One harness run for the module (the `smoke` fixture), taking a minute: started first in a parallel
# run, on the worker of the other loads (tests/conftest.py's SHARED_WORKER).
pytestmark = [pytest.mark.timeout(RUN_SECONDS + 60), pytest.mark.slow]


@dataclass(frozen=True)
class SmokeRun:
    results: str
    workdir: Path


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """One harness run shared by the module: it takes tens of seconds, and every test only reads it."""
    tmp = tmp_path_factory.mktemp("bench-smoke")
    results, workdir = tmp / "RESULTS.md", tmp / "work"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--results", str(results), "--workdir", str(workdir)],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")},
        capture_output=True,
        text=True,
        timeout=RUN_SECONDS,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}; operator logs in {workdir}\n{done.stderr[-4000:]}"
    return SmokeRun(results.read_text(), workdir)


def table(markdown: str, heading: str) -> list[list[str]]:
    """The body rows of the first table under ``heading``, as stripped cells."""
    lines = markdown.split(f"\n{heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start + 2 : end]]


def figure(markdown: str, heading: str, name: str) -> float:
    """A figure's median from a section's table, unit dropped."""
    rows = [row for row in table(markdown, heading) if row[0] == name]
    assert len(rows) == 1, f"{name!r} not reported once under {heading!r}"
    return number(rows[0][1])


def number(cell: str) -> float:
    match = NUMBER.match(cell)
    assert match, f"{cell!r} carries no number"
    return float(match.group().replace(",", ""))


def test_the_results_file_has_the_targets_table_and_a_section_per_benchmark(smoke: SmokeRun) -> None:
    headings = re.findall(r"^## .*$", smoke.results, flags=re.MULTILINE)
    expected = ["## Targets"] + [f"## {i}. {title}" for i, title in enumerate(SECTIONS, start=1)]
    assert [h for h in headings if h != "## Machine"] == expected


def test_every_benchmark_has_a_target_and_every_target_carries_a_number_and_a_verdict(
    smoke: SmokeRun,
) -> None:
    rows = table(smoke.results, "## Targets")
    assert {row[0] for row in rows} == set(SECTIONS)
    for benchmark, name, median, target, verdict in rows:
        assert NUMBER.match(median), f"{benchmark}: {name} has median {median!r}"
        assert target.startswith(("≤", "≥")), f"{benchmark}: {name} has no target"
        assert VERDICT.fullmatch(verdict), f"{benchmark}: {name} has verdict {verdict!r}"


def test_the_loop_benchmark_ran_every_peer_against_ours(smoke: SmokeRun) -> None:
    heading = "## 1. Loop overhead"
    for peer in ("bare messages.create", "the SDK's tool runner", "pydantic-ai", "LangGraph ReAct"):
        assert figure(smoke.results, heading, f"our loop ÷ {peer}") > 0


def test_the_scale_benchmark_counted_the_operators_api_requests(smoke: SmokeRun) -> None:
    assert figure(smoke.results, "## 3. Operator at scale", "3 runs: API requests per iteration") > 0


def test_the_checkpoint_benchmark_measured_bytes_at_every_mark(smoke: SmokeRun) -> None:
    for mark in (2, 6):
        assert figure(smoke.results, "## 4. Checkpoint cost", f"bytes written in iteration {mark}") > 0


def test_the_context_benchmark_ran_every_iteration_and_tabled_input_tokens_per_iteration(
    smoke: SmokeRun,
) -> None:
    heading = "## 5. Long runs: context management"
    completed = figure(smoke.results, heading, "12 iterations with the defaults: iterations completed")
    assert completed == 13
    assert "| defaults, cache: full price | EndTurn | 13 |" in smoke.results
    assert "| management off: input | EndTurn | 13 |" in smoke.results  # 12 results fit the window


def test_both_profiles_were_taken_and_summarised(smoke: SmokeRun) -> None:
    assert "**Profile of our loop**" in smoke.results
    assert "**Profile of the operator process**" in smoke.results
    assert (smoke.workdir / "operator-3.prof").stat().st_size > 0


def test_the_replica_benchmark_attributed_every_run_to_one_replica_of_each_configuration(
    smoke: SmokeRun,
) -> None:
    for title, replicas in (("4 runs, 1 replica", 1), ("4 runs, 2 replicas", 2)):
        heading = re.search(rf"^\*\*{title}, per replica\*\*.*$", smoke.results, flags=re.MULTILINE)
        assert heading, f"no per-replica table for {title}"
        rows = table(smoke.results, heading.group())
        assert [row[0] for row in rows] == [f"replica-{i}" for i in range(replicas)]
        assert sum(int(row[1]) for row in rows) == 4, "every run finished on exactly one replica"
    assert figure(smoke.results, "## 6. Replicas sharing the runs", "4 runs, 2 replicas: runs finished") == 4


def test_the_console_benchmark_timed_the_big_run_and_the_long_list(smoke: SmokeRun) -> None:
    heading = "## 7. Web console: big runs, long lists"
    assert figure(smoke.results, heading, "a run of 5 turns opens (request → last byte)") > 0
    assert figure(smoke.results, heading, "a run of 5 turns: page size") > 1
    assert figure(smoke.results, heading, "the runs page with 61 runs in the namespace (one page of 50)") > 0
