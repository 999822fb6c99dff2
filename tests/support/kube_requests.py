"""Talking to the scenario's API server from integration tests: plain requests and waiting for runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.clusters import TestCluster

FINISHED = ("Succeeded", "Failed", "Cancelled")


async def request(cluster: TestCluster, method: str, path: str, **kwargs: Any) -> Any:
    """The decoded answer; anything but a success fails the test with the server's Status."""
    return await cluster.request(method, path, **kwargs)


async def until(check: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def wait_finished(cluster: TestCluster, name: str, timeout: float = 45.0) -> dict[str, Any]:
    """The run in the test namespace once its phase is final."""
    found: dict[str, Any] = {}

    async def finished() -> bool:
        nonlocal found
        found = await cluster.request("GET", f"{cluster.runs_path}/{name}")
        return found.get("status", {}).get("phase") in FINISHED

    await until(finished, f"{name} to finish", timeout)
    return found
