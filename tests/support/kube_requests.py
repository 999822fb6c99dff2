"""Talking to the scenario's API server from integration tests: plain requests and waiting for runs
(`until` is tests/support/waiting.py's, here too for the tests that import it from here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.clusters import TestCluster
from tests.support.waiting import until as until

FINISHED = ("Succeeded", "Failed", "Cancelled")


async def request(cluster: TestCluster, method: str, path: str, **kwargs: Any) -> Any:
    """The decoded answer; anything but a success fails the test with the server's Status."""
    return await cluster.request(method, path, **kwargs)


async def cancel_run(cluster: TestCluster, name: str) -> None:
    """Sets spec.cancel on the run ``name`` in the test namespace, as `kubectl agentrun cancel` does."""
    await request(
        cluster,
        "PATCH",
        f"{cluster.runs_path}/{name}",
        json={"spec": {"cancel": True}},
        headers={"Content-Type": "application/merge-patch+json"},
    )


async def wait_finished(cluster: TestCluster, name: str, timeout: float = 45.0) -> dict[str, Any]:
    """The run in the test namespace once its phase is final."""
    run: dict[str, Any] = await until(
        lambda: cluster.request("GET", f"{cluster.runs_path}/{name}"),
        f"{name} to finish",
        timeout,
        done=lambda run: run.get("status", {}).get("phase") in FINISHED,
        every=0.1,
    )
    return run


async def wait_status(
    cluster: TestCluster,
    name: str,
    done: Callable[[dict[str, Any]], object],
    what: str = "",
    timeout: float = 90.0,
) -> dict[str, Any]:
    """The status of the run ``name`` once ``done`` accepts it (a run not there yet has an empty one)."""

    async def status() -> dict[str, Any]:
        run = await cluster.get_run(name)
        return dict((run or {}).get("status") or {})

    found: dict[str, Any] = await until(
        status, f"{name}: {what or 'its status'}", timeout, done=done, every=0.2
    )
    return found


def phase_in(*phases: str) -> Callable[[dict[str, Any]], bool]:
    """For wait_status: the run's phase is one of ``phases``."""
    return lambda status: status.get("phase") in phases
