"""Before Kopf starts: is the cluster reachable as configured, and is the AgentRun CRD served there?"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from agentrun.api import AGENT_PLURAL, INSTALL_CRDS, QUOTA_PLURAL, SCHEDULE_PLURAL, TEMPLATE_PLURAL
from agentrun.kube import kubeconfig_loading
from agentrun.kube.calling import KubeClient, connect
from agentrun.kube.errors import APIError, APINotFoundError
from agentrun.kube.failures import explained
from agentrun.kube.kubeconfig_loading import ClusterAccess
from agentrun.kube.scanning import kopf_may_scan

logger = logging.getLogger(__name__)

CRD_MISSING = f"the AgentRun CRD is not installed; install the CRDs with `{INSTALL_CRDS}`"

#: The other CRDs, and what the operator cannot do without each (it serves runs all the same).
OPTIONAL_CRDS = {
    QUOTA_PLURAL: ("AgentRunQuota", "runs are not limited by quotas"),
    AGENT_PLURAL: ("Agent", "runs with spec.agentRef wait for their Agent"),
    SCHEDULE_PLURAL: ("AgentSchedule", "no schedule creates runs"),
    TEMPLATE_PLURAL: ("SandboxTemplate", "runs with spec.sandbox.templateRef wait for their template"),
}

#: How often, and how far apart, discovery is asked again before the other CRDs are called missing.
SETTLE_ATTEMPTS = 3
SETTLE_SECONDS = 1.0

#: How often a missing CRD is looked for again, and how often the warning about it is repeated.
CRD_POLL_SECONDS = 2.0
CRD_WARNING_SECONDS = 60.0


async def connect_checked(namespaces: Sequence[str]) -> tuple[KubeClient, bool, bool]:
    """connect(), then one list of AgentRuns wherever the operator is to watch, before Kopf starts.

    Why: Kopf retries an unreachable server for a minute and then dies with a traceback, and retries a
    403 forever. This says which in one line (KubeFailure) and the operator exits, so a misconfiguration
    is seen at startup, not guessed from silence. A missing CRD is different: it is often installed
    right after the operator (a GitOps sync, a chart without its crds/), so the operator says so in one
    warning and waits for it (:func:`wait_for_crd`), and no pod crash-loops. Returns the client,
    whether the CRD is served and whether Kopf may scan the cluster (kube/scanning.py), checked in that
    order so that a failure that stops the operator is the one line it prints.
    """
    access = await kubeconfig_loading.load()
    kube = await connect(access)
    try:
        served = await _crd_served(kube, namespaces, access)
        scanning = await kopf_may_scan(kube, namespaces)
        if served:
            await warn_of_missing_crds(kube)
    except BaseException:
        await kube.close()
        raise
    return kube, served, scanning


async def warn_of_missing_crds(kube: KubeClient) -> None:
    """One warning naming the other CRDs that are not installed, with the command that installs them all.

    Why: Kopf's own warning ("Unresolved resources cannot be served") names no command, and the quota
    view's warning comes only with the first run; an AgentRun CRD installed alone must be seen at once.
    """
    missing: list[tuple[str, str]] = []
    for attempt in range(SETTLE_ATTEMPTS):
        if attempt:  # CRDs applied together with the AgentRun one may reach discovery a moment later
            await asyncio.sleep(SETTLE_SECONDS)
        try:
            plurals = await kube.served_plurals()
        except APIError as exc:  # discovery is open to everyone; if it fails, Kopf's own warning remains
            logger.debug("could not read the served agentrun.dev resources: %s", exc)
            return
        missing = [OPTIONAL_CRDS[p] for p in OPTIONAL_CRDS if p not in plurals]
        if not missing:
            return
    if missing:
        kinds = ", ".join(kind for kind, _ in missing)
        effects = "; ".join(effect for _, effect in missing)
        logger.warning(
            "the %s CRD%s not installed (%s); install the CRDs with `%s`",
            kinds,
            "s are" if len(missing) > 1 else " is",
            effects,
            INSTALL_CRDS,
        )


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
            await warn_of_missing_crds(kube)
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
