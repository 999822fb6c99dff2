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

from agentrun.sandbox.kube_api import KubeAPI
from tests.support.clusters import TestCluster, emulated_cluster, real_cluster
from tests.support.rbac import SessionRecord


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
    KubeAPI.stopped_hooks.append(operator_requests.collect)
    try:
        yield
    finally:
        KubeAPI.stopped_hooks.remove(operator_requests.collect)


@pytest.fixture
async def cluster(real_kubeconfig: Path | None) -> AsyncIterator[TestCluster]:
    """The scenario's API server: a fresh emulator, or a namespace of its own on a real server."""
    if real_kubeconfig is None:
        async with emulated_cluster() as emulated:
            yield emulated
    else:
        async with real_cluster(real_kubeconfig) as real:
            yield real
