"""The console table and bench/RESULTS.md, both rendered from the same sections."""

from __future__ import annotations

from collections.abc import Sequence

from bench.figures import Figure, Section
from bench.machine import Machine


def table(sections: Sequence[Section]) -> str:
    rows: list[tuple[str, ...]] = [("benchmark", "figure", "median", "n", "target", "verdict", "note")]
    for section in sections:
        for figure in section.figures:
            rows.append(
                (
                    section.key,
                    figure.name,
                    figure.shown_value,
                    str(figure.repeats),
                    figure.shown_target,
                    figure.verdict,
                    figure.note,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _figure_rows(figures: Sequence[Figure]) -> list[str]:
    lines = ["| figure | median | runs | target | verdict | note |", "| --- | --- | --- | --- | --- | --- |"]
    for f in figures:
        verdict = f"**{f.verdict}**" if f.passed is False else f.verdict
        lines.append(
            f"| {f.name} | {f.shown_value} | {f.repeats} | {f.shown_target} | {verdict} | {f.note} |"
        )
    return lines


def markdown(
    sections: Sequence[Section], machine: Machine, *, command: str, load_after: tuple[float, float, float]
) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in machine.versions.items())
    lines = [
        "# Benchmark results",
        "",
        f"Written by `{command}` on {machine.date} at commit {machine.commit}. Regenerate with `make bench`;",
        "every figure is the median over the number of runs shown, and every ratio is taken between",
        "contenders measured side by side in the same process run (never across runs or machines).",
        "",
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
        f"| CPU | {machine.cpu}, {machine.cores} cores |",
        f"| RAM | {machine.ram_gib:.1f} GiB |",
        f"| OS | {machine.platform} |",
        f"| Python | {machine.python} |",
        f"| packages | {versions} |",
        "| load average (1, 5, 15 min) | before: "
        + ", ".join(f"{x:.2f}" for x in machine.load_before)
        + "; after: "
        + ", ".join(f"{x:.2f}" for x in load_after)
        + " |",
        "",
        "The machine is shared (other work ran at the same time; see the load average), so absolute times",
        "are noisy. Ratios are measured side by side and randomised in order, which cancels most of that",
        "noise; the operator-at-scale figures are absolute and are the most affected.",
        "",
        "## Targets",
        "",
    ]
    targeted = [(s, f) for s in sections for f in s.figures if f.target is not None]
    lines += ["| benchmark | figure | median | target | verdict |", "| --- | --- | --- | --- | --- |"]
    for section, f in targeted:
        verdict = f"**{f.verdict}**" if f.passed is False else f.verdict
        lines.append(f"| {section.title} | {f.name} | {f.shown_value} | {f.shown_target} | {verdict} |")
    for number, section in enumerate(sections, start=1):
        lines += ["", f"## {number}. {section.title}", "", section.method, ""]
        lines += _figure_rows(section.figures)
        if section.notes:
            lines.append("")
            lines += [f"- {note}" for note in section.notes]
        for detail in section.details:
            lines += ["", detail]
    return "\n".join(lines) + "\n"
