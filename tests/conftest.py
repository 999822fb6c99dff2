"""Session-wide: which API server the scenarios run against, and the secret-leak scan last.

`pytest` runs every integration scenario against the Kubernetes API emulator. `pytest --real-cluster`
(`make e2e`) runs the same scenarios against the API server KUBECONFIG points at; scenarios that need
something only the emulator can do say why in their `emulator_only` marker and are deselected (listed
at the end of the run), never skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clusters import reachable, real_server_session

LAST = "test_no_secret_appears_in_anything_the_operators_left_behind"
DESELECTED = pytest.StashKey[list[tuple[str, str]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-cluster",
        action="store_true",
        help="run the integration scenarios against the API server KUBECONFIG points at (make e2e)",
    )
    parser.addoption(
        "--real-node",
        action="store_true",
        help="run tests/node: the chart's operator in pods on a node of KUBECONFIG's cluster (make e2e-node)",
    )


def real_cluster_requested(config: pytest.Config) -> bool:
    return bool(config.getoption("--real-cluster")) or real_node_requested(config)


def real_node_requested(config: pytest.Config) -> bool:
    return bool(config.getoption("--real-node"))


#: The node tier's folder: its scenarios run the operator in pods, so only with --real-node.
NODE_TESTS = Path(__file__).parent / "node"


def pytest_configure(config: pytest.Config) -> None:
    if not real_cluster_requested(config):
        return
    kubeconfig = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(":")[0]).expanduser()
    why = reachable(kubeconfig)
    if why:
        raise pytest.UsageError(
            f"--real-cluster: no API server answers at {kubeconfig}: {why}. Point KUBECONFIG at a "
            "running cluster (see docs/testing.md, 'Testing against a real API server')."
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real = real_cluster_requested(config)
    node = real_node_requested(config)
    marker = "emulator_only" if real else "real_only"
    kept, dropped = [], []
    for item in items:
        if NODE_TESTS in Path(item.path).parents and not node:
            dropped.append(item)
            config.stash.setdefault(DESELECTED, []).append(
                (item.nodeid, "runs the operator in pods on a real node: make e2e-node")
            )
            continue
        mark = item.get_closest_marker(marker)
        if mark is None:
            kept.append(item)
            continue
        reason = mark.args[0] if mark.args else ""
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: @{marker} needs a reason")
        dropped.append(item)
        config.stash.setdefault(DESELECTED, []).append((item.nodeid, reason))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    kept.sort(key=lambda item: item.name == LAST)
    items[:] = kept


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    deselected = config.stash.get(DESELECTED, [])
    if deselected:
        server = "a real API server" if real_cluster_requested(config) else "the emulator"
        terminalreporter.section(f"not run against {server}, and why")
        for nodeid, reason in deselected:
            terminalreporter.line(f"{nodeid}: {reason}")


@pytest.fixture(scope="session")
def real_kubeconfig(pytestconfig: pytest.Config) -> Iterator[Path | None]:
    """The real server's admin kubeconfig with the CRD applied, or None on the emulator."""
    if not real_cluster_requested(pytestconfig):
        yield None
        return
    kubeconfig = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(":")[0]).expanduser()
    with real_server_session(kubeconfig) as prepared:
        yield prepared
