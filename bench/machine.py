"""The machine and software a result was measured on, so numbers from different runs can be compared."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # no stubs in the dev group

PACKAGES = (
    "agentrun-operator",
    "anthropic",
    "httpx2",
    "aiohttp",
    "kopf",
    "kubernetes-asyncio",
    "kmock",
    "pydantic",
    "pydantic-ai-slim",
    "langgraph",
    "langgraph-prebuilt",
    "langchain-core",
    "langchain-anthropic",
    "psutil",
)


@dataclass(frozen=True)
class Machine:
    date: str
    cpu: str
    cores: int
    ram_gib: float
    load_before: tuple[float, float, float]
    python: str
    platform: str
    commit: str
    versions: dict[str, str]
    # CPU seconds of one core for the reference work (python_speed): 0.0 when not measured.
    reference_seconds: float = 0.0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(root: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{' (with uncommitted changes)' if dirty else ''}"


def reference_work(rounds: int = 20_000) -> int:
    """Work of the kind the operator does per iteration (JSON out and back, dicts, strings, integers),
    in pure Python on one core; a checksum, so it cannot be skipped."""
    document = {"role": "assistant", "content": [{"type": "text", "text": "x" * 200}], "usage": [1, 2, 3]}
    total = 0
    for i in range(rounds):
        document["usage"] = [i, i + 1, i + 2]
        decoded = json.loads(json.dumps(document))
        total += sum(decoded["usage"]) + len(decoded["content"][0]["text"]) + len(f"{i}:{total % 97}")
    return total


def python_speed(repeats: int = 3) -> float:
    """CPU seconds of the reference work, best of ``repeats``: why operator CPU figures from two hosts
    differ. The operator's CPU per iteration scales with it (a host twice as slow here doubles it)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        reference_work()
        best = min(best, time.process_time() - start)
    return best


def describe(root: Path) -> Machine:
    versions: dict[str, str] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    load = os.getloadavg()
    return Machine(
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        cpu=cpu_model(),
        cores=os.cpu_count() or 1,
        ram_gib=psutil.virtual_memory().total / 2**30,
        load_before=(load[0], load[1], load[2]),
        python=platform.python_version(),
        platform=platform.platform(),
        commit=git_commit(root),
        versions=versions,
        reference_seconds=python_speed(),
    )
