"""Shared bits of the emulator tests: the test CRD and short paths."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

WIDGETS_CRD = Path(__file__).parents[1] / "unit" / "sandbox" / "kube_widgets_crd.yaml"
GROUP = "test.agentrun.dev"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/default/widgets"
ALL_WIDGETS = f"/apis/{GROUP}/v1/widgets"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def widget(name: str | None = None, generate_name: str | None = None, **spec: object) -> dict[str, object]:
    metadata: dict[str, object] = {}
    if name:
        metadata["name"] = name
    if generate_name:
        metadata["generateName"] = generate_name
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": metadata,
        "spec": {"task": "build", **spec},
    }


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 5.0, what: str = "condition"
) -> None:
    """Poll ``check`` until it holds: the emulator's controllers (GC, teardown) run asynchronously."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        if await check():
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
