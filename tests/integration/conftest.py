"""Session-wide RBAC check: every request the operator made in the integration tests that ran is one
the Helm chart allows (tests/support/rbac.py). Reported as an error of the session's last test.

Order-independent proof that the chart grants nothing unused is in test_rbac_coverage.py; this
record adds breadth: whatever scenario any integration test drives, the chart must allow it.
Only emulators stopped while an integration module runs are recorded: unit tests of the emulator
itself drive it with Kopf on purpose, with widgets the chart has no business granting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.messages.api import FakeMessagesAPI
from tests.support.clusters import TestCluster, cluster_for
from tests.support.operator_process import OperatorProcess
from tests.support.rbac import SessionRecord
from tests.support.transcript_stores import StoreName, StoreUnderTest, store_under_test


@pytest.fixture(scope="session")
def operator_requests() -> Iterator[SessionRecord]:
    record = SessionRecord()
    yield record
    refused = record.refusals()
    assert not refused, "the chart's RBAC forbids requests the operator made in these tests:\n" + "\n".join(
        refused
    )


@pytest.fixture(scope="module", autouse=True)
def operator_requests_are_allowed_by_the_chart(operator_requests: SessionRecord) -> Iterator[None]:
    EmulatedCluster.stopped_hooks.append(operator_requests.collect)
    try:
        yield
    finally:
        EmulatedCluster.stopped_hooks.remove(operator_requests.collect)


@pytest.fixture
async def cluster(real_kubeconfig: Path | None) -> AsyncIterator[TestCluster]:
    """The scenario's API server: a fresh emulator, or a namespace of its own on a real server."""
    async with cluster_for(real_kubeconfig) as chosen:
        yield chosen


@pytest.fixture
async def transcript_store(
    request: pytest.FixtureRequest, cluster: TestCluster, tmp_path: Path
) -> AsyncIterator[StoreUnderTest]:
    """The transcript store of the scenario: Secrets unless the test is parametrized with
    ``indirect=["transcript_store"]`` (tests/support/transcript_stores.py's STORES)."""
    name: StoreName = getattr(request, "param", "secret")
    async with store_under_test(name, cluster, tmp_path) as store:
        yield store


@pytest.fixture
async def operator(
    request: pytest.FixtureRequest, cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    """The real operator serving `cluster`, calling the module's `model` fixture with the module's
    own API_KEY (each module has its own, so the leak scan can tell them apart)."""
    env = {"ANTHROPIC_API_KEY": request.module.API_KEY, "ANTHROPIC_BASE_URL": model.url}
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process
