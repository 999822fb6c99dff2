"""The emulator with the AgentRun and Agent CRDs, for the Agent validator's status writes."""

from __future__ import annotations

import pytest


@pytest.fixture
def served_crds() -> list[str]:
    return ["agentruns.agentrun.dev.yaml", "agents.agentrun.dev.yaml"]
