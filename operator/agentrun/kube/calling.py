"""The operator's Kubernetes client: every call the product makes outside Kopf goes through :func:`call`.

Why one call point: that is where a failure is translated into a typed error (kube/errors.py), once,
so no caller sees kubernetes_asyncio's ApiException or a bare aiohttp error, and the retry policy
(kube/retrying.py) can trust ``retryable``. Kopf's own watch and patch traffic and the tools'
read-only reader (tools/kube_reading.py) keep their own clients.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any, Literal, cast
from urllib.parse import quote

from kubernetes_asyncio import client

from agentrun import __version__
from agentrun.api import AGENT_PLURAL, GROUP, PLURAL, QUOTA_PLURAL, SCHEDULE_PLURAL, TEMPLATE_PLURAL, VERSION
from agentrun.api.transcripts import StorageKind
from agentrun.kube import kubeconfig_loading
from agentrun.kube.errors import APINotFoundError, refused, typed_errors
from agentrun.kube.kubeconfig_loading import ClusterAccess
from agentrun.kube.writing import LeanWrites

__all__ = ["JSON_PATCH", "MERGE_PATCH", "USER_AGENT", "KubeClient", "call", "connect", "opened"]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
#: An object's metadata only, as kube-apiserver serves it to `kubectl get -o name` (no data, no spec).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
USER_AGENT = f"agentrun-operator/{__version__}"


async def connect(access: ClusterAccess | None = None) -> KubeClient:
    """A client for ``access``, by default the cluster Kopf logs in to (kube/kubeconfig_loading.py)."""
    if access is None:
        access = await kubeconfig_loading.load()
    api_client = access.api_client()
    # Names the operator in API server audit logs (and lets tests tell its requests apart).
    api_client.user_agent = USER_AGENT
    return KubeClient(api_client)


async def call(request: Awaitable[Any]) -> bytes:
    """The body of a call made with ``_preload_content=False``; any failure raised as a typed APIError.

    Why unparsed: the parsed path builds model objects and parses every timestamp with dateutil, a
    few percent of the operator's CPU at scale for responses nobody reads (bench/RESULTS.md). And the
    client checks the status only on the parsed path, so without the check here a refused call would pass.
    """
    response = await opened(request)
    try:
        with typed_errors():
            body: bytes = await response.read()
    finally:
        response.release()
    return body


async def opened(request: Awaitable[Any]) -> Any:
    """The response of a call made with ``_preload_content=False``, its status checked and its body
    unread (a watch streams it); any failure raised as a typed APIError. The caller releases it."""
    with typed_errors():
        response = await request
    if not 200 <= response.status <= 299:
        try:
            with typed_errors():
                body = await response.read()
        finally:
            response.release()
        raise refused(response.status, response.reason, body, response.headers)
    return response


def _segment(value: str) -> str:
    """One path segment, every reserved character encoded (as the generated API methods do)."""
    return quote(value, safe="")


async def call_json(request: Awaitable[Any]) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(await call(request)))


class KubeClient:
    """The calls the operator, `agentrun run` and the kubectl plugin make, each through :func:`call`."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self._lean = LeanWrites.of(api_client)

    async def close(self) -> None:
        if self._lean is not None:
            await self._lean.close()
        await self.api_client.close()

    # AgentRuns -----------------------------------------------------------------------------------

    async def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        return await call_json(
            self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
            )
        )

    async def create_run(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Raises APIAlreadyExistsError when a run of that name exists."""
        return await call_json(
            self._custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, _preload_content=False
            )
        )

    async def list_runs(
        self, namespace: str | None, *, limit: int = 0, label_selector: str | None = None
    ) -> dict[str, Any]:
        """One page of AgentRuns in ``namespace`` (None: all namespaces; ``limit`` 0: no limit)."""
        selected: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            request = self._custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, limit=limit, _preload_content=False, **selected
            )
        else:
            request = self._custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, limit=limit, _preload_content=False, **selected
            )
        return await call_json(request)

    async def patch_run(
        self, namespace: str, name: str, patch: Any, *, content_type: str = MERGE_PATCH
    ) -> None:
        """A merge patch (or, with JSON_PATCH, a list of operations) on the run's main object."""
        await call(
            self._custom.patch_namespaced_custom_object(  # type: ignore[call-arg]
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                patch,
                _content_type=content_type,
                _preload_content=False,
            )
        )

    async def patch_run_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge patch on the status subresource (a status sent to the main object is ignored)."""
        await self._patch_status(PLURAL, namespace, name, status)

    async def delete_run(self, namespace: str, name: str, uid: str) -> None:
        """Deletes that very run (a uid precondition: never a newer run of that name), dependents after it."""
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid), propagation_policy="Background"
        )
        await call(
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, body=body, _preload_content=False
            )
        )

    async def _patch_status(self, plural: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{_segment(namespace)}/{plural}/{_segment(name)}/status"
        await self._write("PATCH", path, {"status": status}, content_type=MERGE_PATCH)

    # Agents --------------------------------------------------------------------------------------

    async def get_agent(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Agent, or None when there is none of that name (yet)."""
        try:
            return await call_json(
                self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, AGENT_PLURAL, name, _preload_content=False
                )
            )
        except APINotFoundError:
            return None

    async def patch_agent_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge patch on the Agent's status subresource (its validation: controller/agents/)."""
        await self._patch_status(AGENT_PLURAL, namespace, name, status)

    # SandboxTemplates ----------------------------------------------------------------------------

    async def get_sandbox_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The SandboxTemplate, or None when there is none of that name (or its CRD is not installed)."""
        try:
            return await call_json(
                self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, TEMPLATE_PLURAL, name, _preload_content=False
                )
            )
        except APINotFoundError:
            return None

    # AgentSchedules ------------------------------------------------------------------------------

    async def patch_schedule_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge patch on the AgentSchedule's status subresource."""
        await self._patch_status(SCHEDULE_PLURAL, namespace, name, status)

    # AgentRunQuotas ------------------------------------------------------------------------------

    async def get_quota(self, namespace: str, name: str) -> dict[str, Any]:
        return await call_json(
            self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, QUOTA_PLURAL, name, _preload_content=False
            )
        )

    async def list_quotas(self, namespace: str | None) -> list[dict[str, Any]]:
        """Every AgentRunQuota of ``namespace`` (None: of all namespaces; APINotFoundError when the CRD
        is not installed)."""
        if namespace is None:
            request = self._custom.list_cluster_custom_object(
                GROUP, VERSION, QUOTA_PLURAL, _preload_content=False
            )
        else:
            request = self._custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, QUOTA_PLURAL, _preload_content=False
            )
        listing = await call_json(request)
        return list(listing.get("items") or [])

    async def replace_quota_status(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT of the status subresource: ``body`` is the whole object, its metadata.resourceVersion the
        precondition (a quota changed meanwhile answers APIConflictError: re-read and re-apply)."""
        return await call_json(
            self._custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, namespace, QUOTA_PLURAL, name, body, _preload_content=False
            )
        )

    async def patch_quota_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge patch on the AgentRunQuota's status: the copy of a ledger kept in PostgreSQL."""
        await self._patch_status(QUOTA_PLURAL, namespace, name, status)

    # Leases (replica membership) ----------------------------------------------------------------

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """APIAlreadyExistsError when the name is taken (a Lease left by an earlier process of that name)."""
        return await call_json(
            self._coordination.create_namespaced_lease(namespace, body, _preload_content=False)  # type: ignore[arg-type]
        )

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return await call_json(
            self._coordination.read_namespaced_lease(name, namespace, _preload_content=False)
        )

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT of the whole Lease; its metadata.resourceVersion is the precondition (APIConflictError
        when it changed meanwhile, APINotFoundError when it was deleted)."""
        return await call_json(
            self._coordination.replace_namespaced_lease(name, namespace, body, _preload_content=False)  # type: ignore[arg-type]
        )

    async def list_leases(self, namespace: str | None, *, label_selector: str) -> list[dict[str, Any]]:
        """The Leases of ``namespace`` (None: of every namespace) that match ``label_selector``."""
        if namespace is None:
            request = self._coordination.list_lease_for_all_namespaces(
                label_selector=label_selector, _preload_content=False
            )
        else:
            request = self._coordination.list_namespaced_lease(
                namespace, label_selector=label_selector, _preload_content=False
            )
        listing = await call_json(request)
        return list(listing.get("items") or [])

    async def delete_lease(self, namespace: str, name: str, *, uid: str | None = None) -> None:
        """Deletes the Lease (with ``uid``: only that very Lease, never a newer one of that name)."""
        body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid) if uid else None)
        await call(
            self._coordination.delete_namespaced_lease(name, namespace, body=body, _preload_content=False)
        )

    # Secrets and ConfigMaps ----------------------------------------------------------------------

    async def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        """The decoded value, or None if the Secret or key is missing (the run waits for it)."""
        try:
            secret = await self.read_object("secret", namespace, name)
        except APINotFoundError:
            return None
        data = secret.get("data") or {}
        if key not in data:
            return None
        return base64.b64decode(data[key]).decode()

    async def exists(self, kind: Literal["Secret", "ConfigMap"], namespace: str, name: str) -> bool:
        """Whether a Secret or ConfigMap exists, read as its metadata only (PartialObjectMetadata).

        Why metadata only: a Secret a sandbox volume mounts is for the kubelet; the operator waits
        for it to exist without ever holding its values.
        """
        plural = "secrets" if kind == "Secret" else "configmaps"
        api = self.api_client
        headers = {**api.default_headers, "Accept": METADATA_ONLY}
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        url = f"{api.configuration.host}/api/v1/namespaces/{_segment(namespace)}/{plural}/{_segment(name)}"
        try:
            await call(api.rest_client.request("GET", url, headers=headers, _preload_content=False))
        except APINotFoundError:
            return False
        return True

    async def create_object(self, storage: StorageKind, namespace: str, body: dict[str, Any]) -> None:
        """Creates a Secret or a ConfigMap (the kinds a transcript is stored in)."""
        kind = "secrets" if storage == "secret" else "configmaps"
        await self._write("POST", f"/api/v1/namespaces/{_segment(namespace)}/{kind}", body)

    async def read_object(self, storage: StorageKind, namespace: str, name: str) -> dict[str, Any]:
        read: Callable[..., Awaitable[Any]] = (
            self._core.read_namespaced_secret
            if storage == "secret"
            else self._core.read_namespaced_config_map
        )
        return await call_json(read(name, namespace, _preload_content=False))

    async def list_objects(
        self, storage: StorageKind, namespace: str, *, label_selector: str
    ) -> list[dict[str, Any]]:
        """The items of one listing of Secrets or ConfigMaps (as the API serves them, without ``kind``)."""
        lister: Callable[..., Awaitable[Any]] = (
            self._core.list_namespaced_secret
            if storage == "secret"
            else self._core.list_namespaced_config_map
        )
        listing = await call_json(lister(namespace, label_selector=label_selector, _preload_content=False))
        return list(listing.get("items") or [])

    # Events and identity -------------------------------------------------------------------------

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        await self._write("POST", f"/api/v1/namespaces/{_segment(namespace)}/events", body)

    async def patch_event(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        path = f"/api/v1/namespaces/{_segment(namespace)}/events/{_segment(name)}"
        await self._write("PATCH", path, body, content_type=MERGE_PATCH)

    # The writes every iteration makes ------------------------------------------------------------

    async def _write(
        self, method: str, path: str, body: dict[str, Any], *, content_type: str = "application/json"
    ) -> bytes:
        """A write sent past the generated API methods, over the lean client (kube/writing.py) where
        no proxy is configured, else through the client's REST layer.

        Why: the writes every iteration makes (a transcript chunk, a status patch, an Event) are plain
        JSON already, and the generated methods walk every body through ``sanitize_for_serialization``
        and their parameter checks (about 5% of the operator's CPU at 1000 runs, bench/RESULTS.md). The
        same TLS, user agent and credentials (refreshed as the generated methods do) carry it, and its
        failures are the same typed errors :func:`call` raises.
        """
        if self._lean is not None:
            return await self._lean.send(method, path, body, content_type)
        return await call(self.request(method, path, body=body, content_type=content_type))

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        query: dict[str, Any] | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The unchecked, unread response to one request on this client's session and credentials;
        pass it to :func:`call` (the body) or :func:`opened` (a stream, the AgentRun watch)."""
        api = self.api_client
        headers = {**api.default_headers, "Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        return await api.rest_client.request(
            method,
            f"{api.configuration.host}{path}",
            query_params=query,
            headers=headers,
            body=body,
            _preload_content=False,
            _request_timeout=timeout,
        )

    async def served_plurals(self) -> set[str]:
        """The agentrun.dev resources the API server serves (whose CRDs are installed), by discovery.

        Why: a 404 on an object does not say whether the object or its whole kind is missing; the
        kubectl plugin asks this after a 404 so it can say "the CRD is not installed" when that is so,
        and the operator names every CRD that is missing at startup. Discovery is open to every
        authenticated identity (system:discovery).
        """
        try:
            body = await call(self.request("GET", f"/apis/{GROUP}/{VERSION}"))
        except APINotFoundError:
            return set()
        resources = json.loads(body).get("resources") or []
        return {
            str(r.get("name")) for r in resources if isinstance(r, dict) and "/" not in str(r.get("name"))
        }

    async def may(self, verb: str, resource: str, *, group: str = "", namespace: str | None = None) -> bool:
        """Whether this identity may ``verb`` the ``resource`` (a SelfSubjectAccessReview, as
        `kubectl auth can-i` asks; open to every authenticated identity)."""
        attributes = {"verb": verb, "group": group, "resource": resource}
        if namespace:
            attributes["namespace"] = namespace
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        body = await self._write("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        return bool((json.loads(body).get("status") or {}).get("allowed"))

    async def who_am_i(self) -> str | None:
        """The user name the API server authenticates us as (a SelfSubjectReview, Kubernetes 1.28+)."""
        review = await call_json(
            client.AuthenticationV1Api(self.api_client).create_self_subject_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},  # type: ignore[arg-type]
                _preload_content=False,
            )
        )
        user = (review.get("status") or {}).get("userInfo") or {}
        name = user.get("username")
        return str(name) if name else None
