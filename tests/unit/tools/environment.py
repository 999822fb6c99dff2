"""A ToolEnvironment for tests: Secrets from a dict, the cluster given explicitly; a sandbox that is a
local directory (the tools' argv run by a real local shell)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.tools.agent_calling import ChildRuns
from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.pod_exec import ExecResult
from agentrun.tools.sandbox.tools import Sandbox


@dataclass
class StaticEnvironment:
    namespace: str = "default"
    run_uid: str = "run-uid-1"
    service_account_name: str | None = None
    secrets: dict[tuple[str, str], str] = field(default_factory=dict)
    connection: KubeConnection | None = None
    reads: list[tuple[str, str]] = field(default_factory=list)
    children: ChildRuns | None = None
    sandboxed: Sandbox | None = None

    async def read_secret(self, name: str, key: str) -> str | None:
        self.reads.append((name, key))
        return self.secrets.get((name, key))

    def kube_connection(self) -> KubeConnection | None:
        return self.connection

    def child_runs(self) -> ChildRuns | None:
        return self.children

    def sandbox(self, spec: SandboxSpec) -> Sandbox | None:
        return self.sandboxed


@dataclass
class LocalSandbox:
    """Runs the tools' argv in a local shell, in a workspace and a state directory of its own."""

    root: Path
    command_timeout_seconds: int = 10
    output_limit_bytes: int = 2048
    memory_limit: str = "64Mi"
    calls: list[Sequence[str]] = field(default_factory=list)

    @property
    def working_dir(self) -> str:
        return str(self.root / "workspace")

    @property
    def state_dir(self) -> str:
        return str(self.root / "state")

    @property
    def oom_counters(self) -> tuple[str, ...]:
        """A file standing in for the container's memory.events: a test's command bumps it."""
        return (str(self.root / "missing.events"), str(self.root / "memory.events"))

    async def exec(self, argv: Sequence[str], *, timeout: float) -> ExecResult:
        self.calls.append(argv)
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
        return ExecResult(stdout, stderr, process.returncode)
