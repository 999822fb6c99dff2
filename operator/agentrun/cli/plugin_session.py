"""What every `kubectl agentrun` command shares: the session (client, namespace, user) it acts in, and
how an API error about a run is worded for the user.

Apart from plugin.py so that the commands kept in their own modules (plugin_approving.py) use the
same session and wording without importing the command table that names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrun.api import INSTALL_CRDS, PLURAL
from agentrun.kube import kubeconfig_loading
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIStatusError
from agentrun.kube.failures import KubeFailure, explain
from agentrun.kube.kubeconfig_loading import ClusterAccess

__all__ = ["NO_RUN_CRD", "PluginError", "Session", "api_error", "connect", "get_run"]

NO_RUN_CRD = (
    f"the AgentRun CRD (agentruns.agentrun.dev) is not installed; install the CRDs with `{INSTALL_CRDS}`"
)


class PluginError(KubeFailure):
    """A message for the user; the plugin prints it and exits 1 (worded already: not explained again)."""


@dataclass
class Session:
    kube: KubeClient
    namespace: str
    user: str | None
    access: ClusterAccess | None = None


async def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Session:
    """kubectl's resolution (kube/kubeconfig_loading.py): --kubeconfig, else KUBECONFIG, else the
    service account, else ~/.kube/config; --context; relative paths, tokenFile and exec plugins."""
    access = await kubeconfig_loading.load(kubeconfig, context)
    return Session(
        kube=KubeClient(access.api_client()),
        namespace=namespace or access.namespace or "default",
        user=access.user,
        access=access,
    )


async def api_error(session: Session, exc: APIStatusError, what: str) -> PluginError:
    """The shared wording (kube/failures.py), e.g. "agentrun ns/name not found".

    A 404 is "not found" only when the AgentRun CRD is served: without it every run is missing, and
    the message says the CRD is (one discovery request, made only after a 404).
    """
    missing = None
    if exc.status == 404 and not await _served(session):
        missing = NO_RUN_CRD
    return PluginError(explain(exc, "access", what, missing=missing) or f"cannot access {what}: {exc}")


async def _served(session: Session) -> bool:
    try:
        return PLURAL in await session.kube.served_plurals()
    except APIStatusError:
        return True  # discovery refused: no better answer than the 404 itself


async def get_run(session: Session, name: str) -> dict[str, Any]:
    try:
        return await session.kube.get_run(session.namespace, name)
    except APIStatusError as exc:
        raise await api_error(session, exc, f"agentrun {session.namespace}/{name}") from exc
