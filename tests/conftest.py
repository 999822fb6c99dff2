"""Session-wide: which API server the scenarios run against, and the secret-leak scan last.

`pytest` runs every integration scenario against the Kubernetes API emulator. `pytest --real-cluster`
(`make e2e`) runs the same scenarios against the API server KUBECONFIG points at; scenarios that need
something only the emulator can do say why in their `emulator_only` marker and are deselected (listed
at the end of the run), never skipped.

The suite also runs in parallel (pytest-xdist, `make test`): each worker collects and deselects on its
own and sends its list back, so the summary is the same; files, and the groups of SHARED_WORKER, stay
on one worker each; the secret-leak scan needs what every worker's operators left, so no worker runs
it: `make test` runs it afterwards over the evidence folder they all wrote to (`--leak-evidence`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import leaks
from tests.support.clusters import reachable, real_server_session
from tests.support.postgres import PostgresServer, running_postgres

LAST = "test_no_secret_appears_in_anything_the_operators_left_behind"
DESELECTED = pytest.StashKey[list[tuple[str, str]]]()
#: What a worker sends back (config.workeroutput) for the controller's summary.
WORKER_DESELECTED = "agentrun_deselected"
EVIDENCE_INPUT = "agentrun_leak_evidence"
#: With `--dist loadfile` (make test) each test file runs on one worker, one test after another (its
#: module-scoped fixtures set up once); the files of a group here share one worker too: the loads,
#: which would otherwise all start at once (the slow tests go first), and the replica scenarios,
#: which time failovers against lease durations.
SHARED_WORKER = {
    "tests/integration/test_load_and_crashes.py": "load",
    "tests/integration/test_quota_load.py": "load",
    "tests/bench/test_harness.py": "load",
}


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
    parser.addoption(
        "--leak-evidence",
        metavar="DIR",
        help="the folder where every operator the tests start leaves what the secret-leak scan reads: "
        "make test gives the parallel run and the scan after it the same one (default: a temporary folder; "
        "spell it --leak-evidence=DIR, or pytest takes DIR for a test path)",
    )


def real_cluster_requested(config: pytest.Config) -> bool:
    return bool(config.getoption("--real-cluster")) or real_node_requested(config)


def real_node_requested(config: pytest.Config) -> bool:
    return bool(config.getoption("--real-node"))


#: The node tier's folder: its scenarios run the operator in pods, so only with --real-node.
NODE_TESTS = Path(__file__).parent / "node"


def in_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker: one of several processes that share the session's tests."""
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    leaks.keep_in(_evidence_folder(config))
    if not real_cluster_requested(config):
        return
    kubeconfig = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(":")[0]).expanduser()
    why = reachable(kubeconfig)
    if why:
        raise pytest.UsageError(
            f"--real-cluster: no API server answers at {kubeconfig}: {why}. Point KUBECONFIG at a "
            "running cluster (see docs/testing.md, 'Testing against a real API server')."
        )


def _evidence_folder(config: pytest.Config) -> Path:
    given = config.getoption("--leak-evidence")
    if given:
        return Path(given)
    if in_worker(config):
        return Path(config.workerinput[EVIDENCE_INPUT])  # type: ignore[attr-defined]
    folder = Path(tempfile.mkdtemp(prefix="agentrun-leak-evidence-"))
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist, in the controller: `--dist loadfile` with the groups of SHARED_WORKER.

    (xdist's own `--dist loadgroup` marks a test's group in its nodeid, which pytest 9.2's nodeids
    no longer take: every test of a group went to a worker of its own.)"""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileOrGroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_WORKER.get(path, path)

    return FileOrGroupScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller: every worker writes its evidence where this process reads it."""
    node.workerinput[EVIDENCE_INPUT] = str(leaks.folder())


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
        if item.name == LAST and in_worker(config):
            dropped.append(item)
            config.stash.setdefault(DESELECTED, []).append(
                (
                    item.nodeid,
                    "scans what the operators of every worker left, so it runs after the parallel run: "
                    "pytest --leak-evidence=DIR with the run's folder (make test does)",
                )
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
    # Slow tests first: in a parallel run the workers end on short tests instead of waiting for a load
    # that started last. The leak scan last (a serial run). The sort is stable: files stay together.
    kept.sort(key=lambda item: (item.name == LAST, item.get_closest_marker("slow") is None))
    items[:] = kept
    if in_worker(config):
        config.workeroutput[WORKER_DESELECTED] = config.stash.get(DESELECTED, [])  # type: ignore[attr-defined]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, in the controller: a worker's deselections, for the summary (each worker collects
    the same tests, so the first list that arrives is kept)."""
    config: pytest.Config = node.config
    reported = getattr(node, "workeroutput", {}).get(WORKER_DESELECTED)
    if reported and not config.stash.get(DESELECTED, []):
        config.stash[DESELECTED] = [(nodeid, reason) for nodeid, reason in reported]


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


@pytest.fixture
async def postgres(tmp_path: Path) -> AsyncIterator[PostgresServer]:
    """A real PostgreSQL server of the test's own (tests/support/postgres.py)."""
    async with running_postgres(tmp_path) as server:
        yield server
