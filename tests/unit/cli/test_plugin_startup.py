"""`kubectl agentrun` starts without what it does not use: each call is a new process, and imports were
most of its time (docs/kubectl-plugin.md, 'Speed')."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pydantic", "agentrun.api.spec", "agentrun.api.status", "kopf", "anthropic", "prometheus_client")


def test_the_plugin_imports_no_pydantic_models_nor_the_operators_runtime() -> None:
    probe = f"import sys, agentrun.cli.plugin; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "", f"imported by agentrun.cli.plugin: {found.stdout.strip()}"
