"""cProfile output summarised for RESULTS.md: own CPU time by package, then the hottest functions."""

from __future__ import annotations

import pstats
from typing import Any


def package_of(filename: str) -> str:
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/agentrun/" in filename:
        return "agentrun." + filename.split("/agentrun/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/agentrun_sandbox/" in filename:
        return "agentrun_sandbox." + filename.split("/agentrun_sandbox/", 1)[1].split("/", 1)[0].removesuffix(
            ".py"
        )
    if "/bench/" in filename:
        return "bench"
    if filename.startswith("<") or "/lib/python" in filename or filename == "~":
        return "stdlib / builtins"
    return filename.rsplit("/", 1)[-1]


def summarise(stats: pstats.Stats, *, packages: int = 10, functions: int = 12) -> str:
    """Markdown tables. Own time (tottime) adds up to the total, so package shares are comparable."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    by_package: dict[str, float] = {}
    total = 0.0
    rows: list[tuple[float, str]] = []
    for (filename, line, func), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        package = package_of(filename)
        by_package[package] = by_package.get(package, 0.0) + tottime
        total += tottime
        where = f"{filename.rsplit('/', 1)[-1]}:{line}" if line else "builtin"
        rows.append((tottime, f"{package}: {func} ({where})"))
    total = total or 1.0
    lines = [f"Time profiled: {total:.2f} s", "", "| package | share |", "| --- | --- |"]
    for package, seconds in sorted(by_package.items(), key=lambda kv: -kv[1])[:packages]:
        lines.append(f"| {package} | {seconds / total * 100:.1f}% |")
    lines += ["", "| hottest functions (own time) | share |", "| --- | --- |"]
    for seconds, label in sorted(rows, reverse=True)[:functions]:
        lines.append(f"| `{label}` | {seconds / total * 100:.1f}% |")
    return "\n".join(lines)


def cumulative(stats: pstats.Stats, names: dict[str, str]) -> str:
    """Cumulative time of chosen functions (``label → 'file-suffix:function'``), as a share of the total."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values()) or 1.0
    lines = ["| code path (cumulative, overlapping) | share |", "| --- | --- |"]
    for label, pattern in names.items():
        suffix, func = pattern.rsplit(":", 1)
        seconds = max(
            (v[3] for (filename, _line, f), v in raw.items() if f == func and filename.endswith(suffix)),
            default=0.0,
        )
        lines.append(f"| {label} | {seconds / total * 100:.1f}% |")
    return "\n".join(lines)
