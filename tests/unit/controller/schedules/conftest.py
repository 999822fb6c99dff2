"""The emulator with the AgentRun, Agent and AgentSchedule CRDs, for the schedule controller's I/O."""

from __future__ import annotations

import pytest


@pytest.fixture
def served_crds() -> list[str]:
    return ["agentruns.agentrun.dev.yaml", "agentschedules.agentrun.dev.yaml"]
