"""The ToolEnvironment of a run: its namespace and identity, its Secrets, the cluster's transport.

Secret values are cached after the first successful read, so the values the controller saw while
deciding the run may start are exactly the ones the tools are built with.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.kube.calling import KubeClient
from agentrun.tools.agent_calling import ChildRuns
from agentrun.tools.environment import KubeConnection, MountMissing, MountUse, SecretMissing, SecretUse
from agentrun.tools.kube_reading import service_account_user
from agentrun.tools.sandbox.pods import RunIdentity as SandboxRun
from agentrun.tools.sandbox.pods import SandboxPod
from agentrun.tools.sandbox.tools import Sandbox


def kube_connection(configuration: Any) -> KubeConnection:
    """The operator's transport taken from a kubernetes_asyncio Configuration (tokens refreshed)."""
    context: ssl.SSLContext | None = None
    if str(configuration.host).startswith("https"):
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        if not configuration.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE

    async def authorization() -> str | None:
        settings = await configuration.auth_settings()
        bearer = settings.get("BearerToken")
        if bearer and bearer.get("value"):
            return str(bearer["value"])
        basic = configuration.get_basic_auth_token()
        return str(basic) if basic else None

    return KubeConnection(server=str(configuration.host), ssl_context=context, authorization=authorization)


@dataclass
class RunToolEnvironment:
    kube: KubeClient | None
    namespace: str
    run_uid: str
    service_account_name: str | None
    _secrets: dict[tuple[str, str], str] = field(default_factory=dict)
    _connection: KubeConnection | None = None
    # Set by the operator: it alone creates and watches child runs (the agent tool kind).
    children: ChildRuns | None = None
    # Set by the operator: it alone starts sandbox pods (the run's name names the pod).
    run_name: str | None = None
    # The run ran before (resumed): a sandbox pod missing at its first command was lost.
    resumed: bool = False
    # Told how long each sandbox pod took to start (metrics), and why: first, replaced or idle.
    sandbox_started: Callable[[float, str], None] | None = None
    # Told of each sandbox pod deleted after spec.sandbox.idleTimeoutSeconds (metrics).
    sandbox_idle_deleted: Callable[[], None] | None = None
    # AGENTRUN_FAULT_SANDBOX_IDLE_SECONDS (tests only): replaces a set spec.sandbox.idleTimeoutSeconds.
    sandbox_idle_seconds: float | None = None
    _sandbox: SandboxPod | None = None

    def child_runs(self) -> ChildRuns | None:
        return self.children

    def sandbox(self, spec: SandboxSpec) -> Sandbox | None:
        connection = self.kube_connection()
        if self.run_name is None or connection is None:
            return None
        if self._sandbox is None:
            identity = SandboxRun(self.namespace, self.run_name, self.run_uid, self.service_account_name)
            self._sandbox = SandboxPod(
                spec,
                identity,
                connection,
                user=service_account_user(self.namespace, self.service_account_name),
                resumed=self.resumed,
                started=self.sandbox_started or _not_counted,
                idle_deleted=self.sandbox_idle_deleted or _no_idle_count,
                idle_seconds=self.sandbox_idle_seconds,
            )
        return self._sandbox

    async def remove_sandbox(self) -> None:
        """The run ended: its sandbox pod goes (unless spec.sandbox keeps it a while)."""
        sandbox = self._sandbox
        if sandbox is None:
            return
        try:
            await sandbox.stop_idling()  # a pod kept for debugging is not deleted as idle either
            keep = sandbox.spec.keep_seconds_after_finished
            if keep:
                # Kept for debugging; garbage collection removes it with the run if the operator
                # restarts before then.
                asyncio.get_running_loop().call_later(keep, _remove_later, sandbox)
            else:
                await sandbox.remove()
        finally:
            if not sandbox.spec.keep_seconds_after_finished:
                await sandbox.close()

    async def close(self) -> None:
        """The execution ended without the run ending (a handoff, a stop): the pod stays for whoever
        resumes the run."""
        if self._sandbox is not None:
            await self._sandbox.close()

    async def read_secret(self, name: str, key: str) -> str | None:
        if (name, key) not in self._secrets:
            if self.kube is None:
                return None
            value = await self.kube.read_secret_key(self.namespace, name, key)
            if value is None:
                return None
            self._secrets[(name, key)] = value
        return self._secrets[(name, key)]

    def kube_connection(self) -> KubeConnection | None:
        if self.kube is None:
            return None
        if self._connection is None:
            self._connection = kube_connection(self.kube.api_client.configuration)
        return self._connection

    async def first_missing(self, uses: list[SecretUse]) -> SecretMissing | None:
        """The first referenced Secret that does not exist yet, or None when all are readable."""
        for use in uses:
            if await self.read_secret(use.ref.name, use.ref.key) is None:
                return SecretMissing(use, self.namespace)
        return None

    async def first_missing_mount(self, uses: list[MountUse]) -> MountMissing | None:
        """The first Secret or ConfigMap a sandbox volume mounts that does not exist yet, or None.
        Existence only: their values are the kubelet's to read."""
        for use in uses:
            if self.kube is not None and not await self.kube.exists(use.kind, self.namespace, use.name):
                return MountMissing(use, self.namespace)
        return None


_removals: set[asyncio.Task[None]] = set()


def _remove_later(sandbox: SandboxPod) -> None:
    async def removing() -> None:
        try:
            await sandbox.remove()
        finally:
            await sandbox.close()

    task = asyncio.get_running_loop().create_task(removing())
    _removals.add(task)
    task.add_done_callback(_removals.discard)


def _not_counted(seconds: float, reason: str) -> None:
    """`agentrun run`: no metrics to count a sandbox start in."""


def _no_idle_count() -> None:
    """`agentrun run`: no metrics to count an idle deletion in."""
