"""The ToolEnvironment of a run: its namespace and identity, its Secrets, the cluster's transport.

Secret values are cached after the first successful read, so the values the controller saw while
deciding the run may start are exactly the ones the tools are built with.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from agentrun.kube.calling import KubeClient
from agentrun.tools.agent_calling import ChildRuns
from agentrun.tools.environment import KubeConnection, SecretMissing, SecretUse


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

    def child_runs(self) -> ChildRuns | None:
        return self.children

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
