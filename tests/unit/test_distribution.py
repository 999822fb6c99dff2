"""The operator ships without its stand-ins: the emulators are a distribution of their own (sandbox/)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def _names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower().replace("_", "-") for r in requirements}


def test_the_operator_depends_on_neither_kmock_nor_the_sync_kubernetes_client_nor_the_sandbox() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = _names(project["dependencies"])
    assert not names & {"kmock", "kubernetes", "agentrun-sandbox"}, names
    assert "kubernetes-asyncio" in names


#: An import of a stand-in, by any spelling (a metric named agentrun_sandbox_* is not one).
STAND_IN_IMPORT = re.compile(
    r"^\s*(from|import)\s+(kmock|agentrun_sandbox)\b|import_module\(\s*[\"'](kmock|agentrun_sandbox)", re.M
)


def test_the_operator_package_holds_no_emulator_code() -> None:
    package = REPO / "operator" / "agentrun"
    assert not (package / "sandbox").exists()
    offenders = [
        str(path.relative_to(REPO))
        for path in package.rglob("*.py")
        if STAND_IN_IMPORT.search(path.read_text())
    ]
    assert offenders == []


def test_the_demo_test_and_bench_groups_install_the_sandbox_from_its_folder() -> None:
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["dependency-groups"]
    assert groups["demo"] == ["agentrun-sandbox @ file:./sandbox"]
    for name in ("test", "bench"):
        assert {"include-group": "demo"} in groups[name], name
    sandbox = tomllib.loads((REPO / "sandbox" / "pyproject.toml").read_text())["project"]
    assert sandbox["name"] == "agentrun-sandbox"
    assert {"kmock", "agentrun-operator"} <= _names(sandbox["dependencies"])
