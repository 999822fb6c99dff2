"""The emulator with the AgentRun and Agent CRDs, for the Agent validator's status writes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator

CRDS = Path(__file__).resolve().parents[4] / "crds"


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    paths = [CRDS / "agentruns.agentrun.dev.yaml", CRDS / "agents.agentrun.dev.yaml"]
    async with KubeEmulator.running(crd_paths=paths) as kube:
        yield kube
