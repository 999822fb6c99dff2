"""The opt-in end-to-end tier: the integration scenarios against the cluster KUBECONFIG points at.

Collected only when asked for with `-m e2e` (`make e2e`, `make e2e-kind`), so `make test` neither
runs nor reports it. Without a reachable cluster every test is skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, reachable_kubeconfig


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if "e2e" not in (config.getoption("markexpr") or ""):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    kubeconfig, why = reachable_kubeconfig(os.environ.get("KUBECONFIG"))
    if kubeconfig is None:
        pytest.skip(f"no reachable Kubernetes cluster: {why}")
    with Cluster.prepared(kubeconfig, tmp_path_factory.mktemp("e2e")) as prepared:
        yield prepared
