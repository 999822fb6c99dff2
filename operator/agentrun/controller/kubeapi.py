"""Kubernetes API access for the parts Kopf does not do for us (status writes, Secrets)."""

from __future__ import annotations

import base64
import os
from collections.abc import Awaitable
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import __version__
from agentrun.api import GROUP, PLURAL, VERSION

MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = f"agentrun-operator/{__version__}"


async def connect() -> client.ApiClient:
    """In-cluster credentials when present, else KUBECONFIG — the same order Kopf uses."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(client_configuration=configuration)
    api_client = client.ApiClient(configuration)
    # Names the operator in API server audit logs (and lets tests tell its requests apart).
    api_client.user_agent = USER_AGENT
    return api_client


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
