"""Fixtures shared by the emulator tests: a running emulator with the test CRD, and a client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import WIDGETS_CRD


@pytest.fixture
async def kube() -> AsyncIterator[EmulatedCluster]:
    async with EmulatedCluster.running(crd_paths=[WIDGETS_CRD]) as kube:
        yield kube


@pytest.fixture
async def client(kube: EmulatedCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient(kube.url) as client:
        yield client
