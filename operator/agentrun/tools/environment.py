"""What tools need from the place a run executes: its identity, its Secrets and its cluster.

The controller and `agentrun run` each provide one; tools never reach for the operator's own
Kubernetes client, so the only cluster identity a tool can use is the run's ServiceAccount.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from agentrun.api.spec_base import SecretKeyRef

if TYPE_CHECKING:
    from agentrun.api.sandbox_spec import SandboxSpec
    from agentrun.tools.agent_calling import ChildRuns
    from agentrun.tools.sandbox.tools import Sandbox


@dataclass(frozen=True)
class KubeConnection:
    """How to reach the API server: the operator's transport, used only with impersonation headers.

    `authorization` returns the current Authorization header value (it may refresh a projected
    token), or None for clusters without token auth.
    """

    server: str
    ssl_context: ssl.SSLContext | None
    authorization: Callable[[], Awaitable[str | None]]

    def url(self, path: str) -> str:
        return self.server.rstrip("/") + path

    async def headers(self, user: str | None) -> dict[str, str]:
        """The current credentials, and ``Impersonate-User`` when acting as ``user`` (None: the
        operator itself), for every request the tools send over this transport."""
        headers: dict[str, str] = {}
        authorization = await self.authorization()
        if authorization:
            headers["Authorization"] = authorization
        if user:
            headers["Impersonate-User"] = user
        return headers


class ToolEnvironment(Protocol):
    @property
    def namespace(self) -> str: ...

    @property
    def run_uid(self) -> str: ...

    @property
    def service_account_name(self) -> str | None: ...

    async def read_secret(self, name: str, key: str) -> str | None:
        """The value of a key of a Secret in the run's namespace, or None when missing."""
        ...

    def kube_connection(self) -> KubeConnection | None:
        """The cluster the Kubernetes tools read, or None when no cluster is configured."""
        ...

    def sandbox(self, spec: SandboxSpec) -> Sandbox | None:
        """The run's sandbox pod (started on its first command), or None where the operator cannot
        start one (`agentrun run` on a laptop)."""
        ...

    def child_runs(self) -> ChildRuns | None:
        """Where agent tools start their child runs, or None where runs cannot be created
        (`agentrun run` on a laptop)."""
        ...


@dataclass(frozen=True)
class SecretUse:
    """One Secret reference of a spec, with the field that makes it, for Pending messages."""

    field: str
    ref: SecretKeyRef


class SecretMissing(Exception):
    """A referenced Secret (or key) does not exist; the run stays Pending until it does."""

    def __init__(self, use: SecretUse, namespace: str) -> None:
        super().__init__(
            f"Secret {namespace}/{use.ref.name} with key {use.ref.key!r} ({use.field}) does not exist "
            "yet; the run starts once it does"
        )
        self.use = use


@dataclass(frozen=True)
class MountUse:
    """A Secret or ConfigMap a sandbox volume mounts, with its field, for Pending messages. Only its
    existence is checked (the kubelet reads it, never the operator)."""

    field: str
    kind: Literal["Secret", "ConfigMap"]
    name: str


class MountMissing(Exception):
    """A Secret or ConfigMap a sandbox volume mounts does not exist; the run stays Pending until it
    does (the kubelet would otherwise hold the pod in ContainerCreating until its start timeout)."""

    def __init__(self, use: MountUse, namespace: str) -> None:
        super().__init__(
            f"{use.kind} {namespace}/{use.name} ({use.field}) does not exist yet; the run starts once it does"
        )
        self.use = use
        self.reason = f"{use.kind}NotFound"


class ToolStartError(Exception):
    """A tool source could not be prepared at run start (an MCP server unreachable after retries)."""
