"""The console table and bench/RESULTS.md, both rendered from the same sections."""

from __future__ import annotations

import re
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
        f"| Python speed | {machine.reference_seconds * 1000:.0f} ms of one core for the reference work "
        "(bench/machine.py; CPU figures scale with it between hosts) |",
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
    lines += ["| benchmark | figure | median | target | verdict |", "| --- | --- | --- | --- | --- |"]
    lines += _target_rows(sections)
    for number, section in enumerate(sections, start=1):
        lines += ["", _section_markdown(number, section)]
    return "\n".join(lines) + "\n"


def _target_rows(sections: Sequence[Section]) -> list[str]:
    rows = []
    for section in sections:
        for f in section.figures:
            if f.target is not None:
                verdict = f"**{f.verdict}**" if f.passed is False else f.verdict
                rows.append(
                    f"| {section.title} | {f.name} | {f.shown_value} | {f.shown_target} | {verdict} |"
                )
    return rows


def _section_markdown(number: int, section: Section) -> str:
    lines = [f"## {number}. {section.title}", "", section.method, ""]
    lines += _figure_rows(section.figures)
    if section.notes:
        lines.append("")
        lines += [f"- {note}" for note in section.notes]
    for detail in section.details:
        lines += ["", detail]
    return "\n".join(lines)


def merge(existing: str, sections: Sequence[Section], *, command: str, date: str, commit: str) -> str:
    """``existing`` results with these sections replaced (or appended) and their targets rows swapped.

    A partial run (``--only replicas --merge``) updates its part of bench/RESULTS.md without discarding the
    figures of the benchmarks it did not run; a line under the header says which sections are newer.
    """
    text = existing.rstrip("\n") + "\n"
    titles = {s.title for s in sections}
    numbered = re.findall(r"^## (\d+)\. (.*)$", text, flags=re.MULTILINE)
    next_number = max((int(n) for n, _ in numbered), default=0) + 1
    for section in sections:
        number = next((int(n) for n, title in numbered if title == section.title), None)
        if number is None:
            number, next_number = next_number, next_number + 1
        block = _section_markdown(number, section)
        pattern = re.compile(rf"^## {number}\. {re.escape(section.title)}\n.*?(?=^## |\Z)", re.S | re.M)
        found = pattern.search(text)
        text = (
            text[: found.start()] + block + "\n\n" + text[found.end() :]
            if found
            else text + "\n" + block + "\n"
        )
    lines = text.splitlines()
    start = lines.index("## Targets")
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    kept = [row for row in lines[first + 2 : end] if row.split("|")[1].strip() not in titles]
    lines[first + 2 : end] = kept + _target_rows(sections)
    updated = ", ".join(s.title for s in sections)
    stale = [
        i for i, line in enumerate(lines) if line.startswith("Updated by ") and line.endswith(f": {updated}.")
    ]
    for i in reversed(stale):
        del lines[i - 1 : i + 1]  # the line and the blank line before it
    header = lines.index("## Machine")
    lines[header - 1 : header - 1] = ["", f"Updated by `{command}` on {date} at commit {commit}: {updated}."]
    return "\n".join(lines).rstrip("\n") + "\n"
