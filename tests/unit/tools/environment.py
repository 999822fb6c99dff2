"""A ToolEnvironment for tests: Secrets from a dict, the cluster given explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.tools.agent_calling import ChildRuns
from agentrun.tools.environment import KubeConnection
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
