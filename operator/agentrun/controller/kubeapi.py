"""Kubernetes API access for the parts Kopf does not do for us (status writes, Secrets)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import __version__
from agentrun.api import GROUP, PLURAL, VERSION
from agentrun.controller import kubeconfig_loading
from agentrun.controller.kube_failures import explained
from agentrun.controller.kubeconfig_loading import ClusterAccess

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = f"agentrun-operator/{__version__}"


async def connect(access: ClusterAccess | None = None) -> client.ApiClient:
    """A client for ``access``, by default the cluster Kopf logs in to (controller/kubeconfig_loading.py)."""
    if access is None:
        access = await kubeconfig_loading.load()
    api_client = access.api_client()
    # Names the operator in API server audit logs (and lets tests tell its requests apart).
    api_client.user_agent = USER_AGENT
    return api_client


CRD_MISSING = "the AgentRun CRD is not installed; install it with `agentrun crd | kubectl apply -f -`"


#: How often a missing CRD is looked for again, and how often the warning about it is repeated.
CRD_POLL_SECONDS = 2.0
CRD_WARNING_SECONDS = 60.0


async def connect_checked(namespaces: Sequence[str]) -> tuple[client.ApiClient, bool]:
    """connect(), then one list of AgentRuns wherever the operator is to watch, before Kopf starts.

    Why: Kopf retries an unreachable server for a minute and then dies with a traceback, and retries a
    403 forever. This says which in one line (KubeFailure) and the operator exits, so a misconfiguration
    is seen at startup, not guessed from silence. A missing CRD is different: it is often installed
    right after the operator (a GitOps sync, a chart without its crds/), so the operator says so in one
    warning and waits for it (:func:`wait_for_crd`), and no pod crash-loops. Returns the client and
    whether the CRD is served.
    """
    access = await kubeconfig_loading.load()
    api_client = await connect(access)
    custom = client.CustomObjectsApi(api_client)
    try:
        served = await _crd_served(custom, namespaces, access)
    except BaseException:
        await api_client.close()
        raise
    return api_client, served


async def wait_for_crd(api_client: client.ApiClient, namespaces: Sequence[str], stop: asyncio.Event) -> bool:
    """Until the CRD is served (True) or ``stop`` is set (False), repeating the warning now and then.

    Why before Kopf starts: Kopf's resource observer ignores the CRDs of its watch's initial listing
    (it has scanned them a moment before), so a CRD created in between is never served.
    """
    custom = client.CustomObjectsApi(api_client)
    warned = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), CRD_POLL_SECONDS)
        if stop.is_set():
            break
        if await _crd_served(custom, namespaces, None, quiet=time.monotonic() - warned < CRD_WARNING_SECONDS):
            logger.info("the AgentRun CRD is installed now; starting")
            return True
        if time.monotonic() - warned >= CRD_WARNING_SECONDS:
            warned = time.monotonic()
    return False


async def _crd_served(
    custom: client.CustomObjectsApi,
    namespaces: Sequence[str],
    access: ClusterAccess | None,
    *,
    quiet: bool = False,
) -> bool:
    plain = [ns for ns in namespaces if not any(c in ns for c in "*?[!")]  # Kopf also takes patterns
    for namespace in plain if namespaces else [None]:
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        with explained("list", f"agentruns {where}", access=access):
            if not await _list_one(custom, namespace, where, quiet=quiet):
                return False
    return True


async def _list_one(
    custom: client.CustomObjectsApi, namespace: str | None, where: str, *, quiet: bool
) -> bool:
    """Lists one AgentRun; False (with the warning) when the CRD is not there, other failures raise."""
    try:
        if namespace is None:
            request = custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, limit=1, _preload_content=False
            )
        else:
            request = custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, limit=1, _preload_content=False
            )
        await unparsed(request)
    except ApiException as exc:
        if exc.status != 404:
            raise
        if not quiet:
            logger.warning("cannot list agentruns %s: %s; waiting for it", where, CRD_MISSING)
        return False
    return True


class KubeAPI:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    async def patch_run_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge patch on the status subresource (a status sent to the main object is ignored)."""
        await unparsed(
            self.custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            )
        )

    async def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        """The decoded value, or None if the Secret or key is missing (the run waits for it)."""
        try:
            secret = await self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = secret.data or {}
        if key not in data:
            return None
        return base64.b64decode(data[key]).decode()

    async def close(self) -> None:
        await self.api_client.close()


async def unparsed(request: Awaitable[Any]) -> bytes:
    """The body of a call made with ``_preload_content=False``, and its error raised as ApiException.

    Why: the parsed path builds model objects and parses every timestamp with dateutil, a few
    percent of the operator's CPU at scale for responses nobody reads (bench/RESULTS.md). And the
    client checks the status only on the parsed path, so without this a refused call would pass.
    """
    response = await request
    try:
        body: bytes = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body, error.headers = body, response.headers
        raise error
    return body


def is_gone(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and exc.status in (404, 410)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, ApiException) and (exc.status in (409, 429) or (exc.status or 0) >= 500)
