"""Running the project's own commands as a user would: a child process with a clean cluster environment."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

#: Variables of the caller's shell that would point a command at some other cluster or model.
FOREIGN = ("KUBECONFIG", "KUBERNETES_", "ANTHROPIC_")


async def run_command(
    *command: str | Path, env: Mapping[str, str] | None = None, timeout: float = 120
) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``command``; only ``env`` says which cluster and model it uses."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    process = await asyncio.create_subprocess_exec(
        *map(str, command),
        env={**base, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode or 0, out.decode(), err.decode()
