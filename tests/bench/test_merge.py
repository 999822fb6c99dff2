"""`python -m bench --only NAME --merge`: a partial run updates its own part of RESULTS.md, nothing else."""

from __future__ import annotations

from dataclasses import replace

from bench.figures import Figure, Section, Target
from bench.machine import Machine, python_speed, reference_work
from bench.reporting import markdown, merge

MACHINE = Machine(
    cpu="test CPU",
    cores=2,
    ram_gib=1.0,
    platform="test",
    python="3.11",
    versions={},
    date="2026-01-01 00:00 UTC",
    commit="aaaaaaa",
    load_before=(0.0, 0.0, 0.0),
)


def section(key: str, title: str, value: float) -> Section:
    result = Section(key, title, f"How {key} is measured.")
    result.add(Figure(f"{key} figure", value, "×", 1, Target(1.0)))
    result.notes.append(f"{key} note {value}")
    return result


def test_merging_replaces_the_runs_sections_and_target_rows_and_keeps_the_others() -> None:
    old = markdown(
        [section("loop", "Loop overhead", 1.5), section("replicas", "Replicas", 0.5)],
        MACHINE,
        command="python -m bench",
        load_after=(0.0, 0.0, 0.0),
    )
    new = merge(
        old,
        [section("replicas", "Replicas", 2.5)],
        command="python -m bench --only replicas --merge",
        date="2026-01-02 00:00 UTC",
        commit="bbbbbbb",
    )
    assert "loop note 1.5" in new and "| Loop overhead | loop figure | 1.500× |" in new
    assert "replicas note 0.5" not in new and "| Replicas | replicas figure | 0.5" not in new
    assert new.count("## 2. Replicas") == 1 and "replicas note 2.5" in new
    assert "| Replicas | replicas figure | 2.500× | ≤ 1.000× | **MISS (+150% vs bound)** |" in new
    assert (
        "Updated by `python -m bench --only replicas --merge` on 2026-01-02 00:00 UTC at commit bbbbbbb"
        in new
    )


def test_merging_a_section_the_file_lacks_appends_it_with_the_next_number() -> None:
    old = markdown([section("loop", "Loop overhead", 0.5)], MACHINE, command="x", load_after=(0.0, 0.0, 0.0))
    new = merge(old, [section("replicas", "Replicas", 0.5)], command="y", date="d", commit="c")
    assert new.index("## 1. Loop overhead") < new.index("## 2. Replicas")
    assert "| Replicas | replicas figure | 0.5" in new and "| Loop overhead | loop figure | 0.5" in new
    assert merge(new, [section("replicas", "Replicas", 0.5)], command="y", date="d", commit="c") == new


def test_the_results_name_the_hosts_python_speed_so_cpu_figures_compare_across_hosts() -> None:
    measured = python_speed(repeats=1)
    text = markdown(
        [section("loop", "Loop overhead", 1.5)],
        replace(MACHINE, reference_seconds=measured),
        command="python -m bench",
        load_after=(0.0, 0.0, 0.0),
    )
    assert 0 < measured < 60
    assert f"| Python speed | {measured * 1000:.0f} ms of one core" in text
    assert reference_work(10) == reference_work(10) > 0  # a checksum of work done, not a constant
    assert reference_work(10) != reference_work(11)
