"""Before Kopf starts: is the cluster reachable as configured, and is the AgentRun CRD served there?"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from agentrun.kube import kubeconfig_loading
from agentrun.kube.calling import KubeClient, connect
from agentrun.kube.errors import APINotFoundError
from agentrun.kube.failures import explained
from agentrun.kube.kubeconfig_loading import ClusterAccess

logger = logging.getLogger(__name__)

CRD_MISSING = "the AgentRun CRD is not installed; install it with `agentrun crd | kubectl apply -f -`"

#: How often a missing CRD is looked for again, and how often the warning about it is repeated.
CRD_POLL_SECONDS = 2.0
CRD_WARNING_SECONDS = 60.0


async def connect_checked(namespaces: Sequence[str]) -> tuple[KubeClient, bool]:
    """connect(), then one list of AgentRuns wherever the operator is to watch, before Kopf starts.

    Why: Kopf retries an unreachable server for a minute and then dies with a traceback, and retries a
    403 forever. This says which in one line (KubeFailure) and the operator exits, so a misconfiguration
    is seen at startup, not guessed from silence. A missing CRD is different: it is often installed
    right after the operator (a GitOps sync, a chart without its crds/), so the operator says so in one
    warning and waits for it (:func:`wait_for_crd`), and no pod crash-loops. Returns the client and
    whether the CRD is served.
    """
    access = await kubeconfig_loading.load()
    kube = await connect(access)
    try:
        served = await _crd_served(kube, namespaces, access)
    except BaseException:
        await kube.close()
        raise
    return kube, served


async def wait_for_crd(kube: KubeClient, namespaces: Sequence[str], stop: asyncio.Event) -> bool:
    """Until the CRD is served (True) or ``stop`` is set (False), repeating the warning now and then.

    Why before Kopf starts: Kopf's resource observer ignores the CRDs of its watch's initial listing
    (it has scanned them a moment before), so a CRD created in between is never served.
    """
    warned = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CRD_POLL_SECONDS)
        if stop.is_set():
            break
        if await _crd_served(kube, namespaces, None, quiet=time.monotonic() - warned < CRD_WARNING_SECONDS):
            logger.info("the AgentRun CRD is installed now; starting")
            return True
        if time.monotonic() - warned >= CRD_WARNING_SECONDS:
            warned = time.monotonic()
    return False


async def _crd_served(
    kube: KubeClient,
    namespaces: Sequence[str],
    access: ClusterAccess | None,
    *,
    quiet: bool = False,
) -> bool:
    plain = [ns for ns in namespaces if not any(c in ns for c in "*?[!")]  # Kopf also takes patterns
    for namespace in plain if namespaces else [None]:
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        with explained("list", f"agentruns {where}", access=access):
            if not await _list_one(kube, namespace, where, quiet=quiet):
                return False
    return True


async def _list_one(kube: KubeClient, namespace: str | None, where: str, *, quiet: bool) -> bool:
    """Lists one AgentRun; False (with the warning) when the CRD is not there, other failures raise."""
    try:
        await kube.list_runs(namespace, limit=1)
    except APINotFoundError:
        if not quiet:
            logger.warning("cannot list agentruns %s: %s; waiting for it", where, CRD_MISSING)
        return False
    return True
