"""What a benchmark reports: figures (medians with their repeat count and target) grouped in sections."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """A bound a figure must meet; kept next to the figure so a miss can say by how much."""

    bound: float
    at_most: bool = True

    def met(self, value: float) -> bool:
        return value <= self.bound if self.at_most else value >= self.bound

    def describe(self, unit: str) -> str:
        return f"{'≤' if self.at_most else '≥'} {_number(self.bound)}{unit_suffix(unit)}"

    def margin(self, value: float) -> str:
        """How far off a missed figure is, relative to its bound."""
        if self.bound == 0:
            return f"{value:+g} over"
        return f"{(value / self.bound - 1) * 100:+.0f}% vs bound"


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    repeats: int
    target: Target | None = None
    note: str = ""

    @property
    def passed(self) -> bool | None:
        return None if self.target is None or math.isnan(self.value) else self.target.met(self.value)

    @property
    def verdict(self) -> str:
        if self.passed is None:
            return "n/a" if self.target is not None else ""
        assert self.target is not None
        return "pass" if self.passed else f"MISS ({self.target.margin(self.value)})"

    @property
    def shown_value(self) -> str:
        return f"{_number(self.value)}{unit_suffix(self.unit)}"

    @property
    def shown_target(self) -> str:
        return self.target.describe(self.unit) if self.target else ""


@dataclass
class Section:
    """One benchmark's results; ``details`` is Markdown appended to RESULTS.md (raw runs, profiles)."""

    key: str
    title: str
    method: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure


def unit_suffix(unit: str) -> str:
    return unit if unit in ("×", "%") else f" {unit}" if unit else ""


def _number(value: float) -> str:
    if math.isnan(value):
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.3f}"
    return f"{value:.3g}"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation): p99 of 100 samples is the 99th smallest, a real sample."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def progress(message: str) -> None:
    """One line on stderr per step, so a long run shows where it is (stdout carries only the table)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
