"""A Kubernetes API emulator for tests, benchmarks and the offline demo: kmock plus a fidelity layer.

kmock's :class:`~kmock.KubernetesEmulator` gives the HTTP handler, request parsing, the ``objects`` view
(every version of every object, for assertions) and a DSL for ad-hoc reactions. Its write semantics are
too naive for a real operator (see design.md, "Kopf against a real API server"), so
:class:`KubeEmulator` serves every Kubernetes request itself, the way kube-apiserver does:

* ``metadata.uid``, ``creationTimestamp``, ``generateName``; the namespace from the URL;
* a global ``resourceVersion`` bumped on every write; lists carry it in ``metadata``; writes that change
  nothing are no-ops (no new version, no watch event), as on a real server;
* ``metadata.generation``: 1 on create, +1 when anything outside ``metadata`` (and ``status`` when it is a
  subresource) changes, and when ``deletionTimestamp`` is set;
* status-subresource isolation: writes to the object ignore ``status``; writes to ``/status`` change
  only ``status``; on create, a custom resource's ``status`` is dropped;
* PATCH: merge patch (RFC 7386), JSON patch (RFC 6902; a failed ``test`` is a 422 ``Invalid``),
  strategic merge patch for built-in types (applied as a merge patch; custom resources answer 415, as the
  real server does); server-side apply answers 415. PUT replaces; a ``resourceVersion`` that does not
  match (in PUT or PATCH bodies) is a 409 Conflict; POST of an existing name is a 409 AlreadyExists;
* DELETE: finalizers keep the object with ``deletionTimestamp`` until they are removed; delete options
  (preconditions, ``propagationPolicy``, ``dryRun``); background garbage collection of objects whose
  ``ownerReferences`` name a deleted (or never existing) owner (``Orphan`` strips the references
  instead; ``Foreground`` is treated as background); namespace deletion empties the namespace first;
  CRD deletion removes its custom resources first (both block on finalizers, as in a real cluster);
  a pod bound to a node stays Terminating for its kubelet, which never comes (``gracePeriodSeconds=0``
  removes it);
* CRDs (``apiextensions.k8s.io/v1``) created through the API or with :meth:`KubeEmulator.load_crd`
  register their resources for discovery and every verb; writes are pruned, defaulted and validated
  against the version's ``openAPIV3Schema`` (:mod:`agentrun.sandbox.kube_schema`), with the server's
  422 messages and ``Warning`` headers for pruned fields (``?fieldValidation=Strict`` turns them into 400);
* ``x-kubernetes-validations``: a safe CEL subset (:mod:`agentrun.sandbox.kube_cel`) covering
  immutability and transition rules; rules outside it are ignored with one log line each;
* ``labelSelector`` / ``fieldSelector`` on list, watch and deletecollection; ``limit``/``continue``
  paging on lists; ``?watch=true`` with ``resourceVersion`` resumption from a bounded history
  (410 Expired beyond it), ``sendInitialEvents`` with the closing bookmark, ``timeoutSeconds``;
* built-in types: v1 namespaces (``default`` and the ``kube-*`` ones exist), configmaps, secrets,
  serviceaccounts, events, pods (with ``pods/log`` serving :attr:`KubeEmulator.pod_logs` as the kubelet),
  events.k8s.io/v1 events, coordination.k8s.io/v1 leases, apiextensions.k8s.io/v1 CRDs; discovery on
  ``/api`` and ``/apis`` with scopes, verbs, kinds, short names and categories;
* server-side Tables (printer columns), so ``kubectl get`` works;
* optional authorization per bearer token (``KubeAPI.running(rbac={token: authorizer})``, see
  :mod:`agentrun.sandbox.kube_authz`): 403 Forbidden with the server's wording, impersonation checks
  (legacy and constrained) and the owner-reference admission check; other tokens are unrestricted;
* rbac.authorization.k8s.io/v1 Roles, ClusterRoles and bindings; with
  :attr:`KubeEmulator.authorize_impersonated_users` they authorize impersonated requests as their
  target (:mod:`agentrun.sandbox.kube_rbac`);
* identities: a token registered in :attr:`KubeEmulator.identities` (``KubeAPI.running(identities=...)``)
  is that user, an authorizer's token its user, any other token ``kube-emulator`` (system:masters);
  ``Impersonate-User`` replaces it. ``kubectl auth whoami`` (SelfSubjectReview) answers with it;
* ValidatingAdmissionPolicy/Binding (admissionregistration.k8s.io/v1, :mod:`agentrun.sandbox.kube_admission`)
  on creates and updates after schema validation, seeing ``request.userInfo``; namespaces carry the
  ``kubernetes.io/metadata.name`` label their selectors match on;
* fault injection (:attr:`KubeEmulator.faults`, see :mod:`agentrun.sandbox.kube_faults`) applied before
  any state change, and a request log (:attr:`KubeEmulator.request_log`) with the RBAC view of each call.

Not emulated: authentication, and RBAC unless an authorizer is given (by default every request is allowed
and identities are only recorded; impersonated requests are authorized as their target only with
``authorize_impersonated_users``; aggregated ClusterRoles are not expanded),
admission webhooks, server-side apply (415), protobuf and CBOR bodies (415, so typed kubectl generators
such as ``kubectl create namespace x`` fail; ``kubectl create -f`` / ``apply -f`` work), OpenAPI v2 and
the built-in kinds' schemas (a minimal OpenAPI v3 is published: enough for kubectl's validation
handshake and for ``kubectl explain`` on custom resources), validation ratcheting, multi-version
conversion beyond rewriting ``apiVersion``, periodic watch bookmarks, ``managedFields``, the real
per-type field selectors of built-ins (any dotted path is accepted), shared storage of core and
events.k8s.io events (they are separate here), ``Foreground`` deletion (treated as background),
kubelets (pods never run).

Running it:

1. In-process::

       async with KubeAPI.running(crd_paths=["crds/agentruns.agentrun.dev.yaml"]) as kube:
           kube.url              # http://127.0.0.1:PORT
           kube.kubeconfig_path  # a kubeconfig for Kopf, kubectl, kubernetes_asyncio
           kube.emulator         # objects, request_log, faults, pod_logs, load_crd(), ...

2. As a child process (the operator under test runs in its own process anyway)::

       python -m agentrun.sandbox.kube_api --port 0 --kubeconfig /tmp/kube.yaml --crd crds/x.yaml

   prints one line ``READY http://127.0.0.1:PORT`` once it listens and runs until SIGTERM/SIGINT.

   ``--auto-namespaces`` lets objects be created in namespaces that do not exist.

Without HTTP, ``create_object``, ``get_object``, ``list_objects``, ``patch_object``, ``delete_object``
and ``load_crd`` seed and inspect state with the same semantics (errors raise :class:`ApiError`).

Memory stays bounded for long benchmark runs: ``history_limit`` versions per object in ``objects``,
``watch_history_limit`` events per resource, ``kmock_request_limit`` raw requests (and, if set,
``request_log_limit`` records). User reactions added through kmock's DSL
(``emulator['get /version'] << {...}``) take precedence and replace the emulator's behaviour for the
requests they match (no state change happens for those); kmock matches them by scanning every earlier
request, so keep them for small tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import json
import logging
import pathlib
import random
import re
import signal
import ssl
import sys
import tempfile
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp.web
import attrs
import kmock
import yaml

from agentrun.sandbox import kube_admission, kube_openapi, kube_patch, kube_schema, kube_tables
from agentrun.sandbox.kube_authz import (
    EMULATOR_ADMIN,
    Attributes,
    Authorizer,
    Decision,
    UserInfo,
    attributes_of,
    constrained_impersonation,
    forbidden,
    identify,
    own_attributes,
)
from agentrun.sandbox.kube_faults import Faults
from agentrun.sandbox.kube_http import (
    ApiError,
    ApiRoute,
    RequestRecord,
    decode_body,
    parse_path,
    rbac_verb,
    status_body,
    truthy,
)
from agentrun.sandbox.kube_rbac import RbacObjects
from agentrun.sandbox.kube_registry import (
    BUILTIN_NAMESPACES,
    BUILTIN_TYPES,
    CRD_CLEANUP_FINALIZER,
    ResourceType,
    crd_problems,
    types_from_crd,
)
from agentrun.sandbox.kube_schema import FieldError
from agentrun.sandbox.kube_selectors import FieldSelector, LabelSelector, SelectorError, label_problems
from agentrun.sandbox.kube_watch import StoredEvent, Watcher

__all__ = ["ApiError", "KubeAPI", "KubeEmulator", "RequestRecord", "main", "write_kubeconfig"]

logger = logging.getLogger(__name__)

StoreKey = tuple[str, str]  # (group, plural): one storage for all versions of a resource
ObjKey = tuple[str | None, str]  # (namespace, name)

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
)
_MERGE = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_SELF_SUBJECT_REVIEWS = ("authentication.k8s.io", "selfsubjectreviews")
#: The label kube-apiserver keeps on every namespace (namespaceSelectors match on it).
_NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
_ACTIONS = {
    "get": kmock.action.FETCH,
    "list": kmock.action.LIST,
    "watch": kmock.action.WATCH,
    "create": kmock.action.CREATE,
    "patch": kmock.action.UPDATE,
    "delete": kmock.action.DELETE,
}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes version ordering: v2 > v1 > v1beta2 > v1beta1 > v1alpha1 > anything else."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[match[2]]
    return (stage, -int(match[1]), -int(match[3] or 0), version)


def _owner_uids(obj: Mapping[str, Any]) -> set[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return {ref["uid"] for ref in refs if isinstance(ref, Mapping) and isinstance(ref.get("uid"), str)}


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


@dataclass
class Reply:
    """An answer before it becomes an HTTP response."""

    status: int
    body: Any = None
    text: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _WatchPlan:
    rtype: ResourceType
    watcher: Watcher | None
    initial: list[tuple[str, Mapping[str, Any]]]
    timeout: float | None
    table: bool
    expired: dict[str, Any] | None = None


MAX_REQUEST_BYTES = 3 * 1024 * 1024


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """The emulated API server as an aiohttp-compatible handler (see the module docstring).

    Object dicts held by the emulator are never mutated after they are stored (every write stores a new
    dict), so reading ``emulator.objects`` or :meth:`get_object` results is safe but they must not be
    modified: write through the API or the ``*_object`` helpers instead.
    """

    #: Versions kept per object in ``emulator.objects[...].history`` (None: unbounded).
    history_limit: int | None = 100
    #: Watch events kept per resource for ``resourceVersion`` resumption; older ones answer 410.
    watch_history_limit: int = 10_000
    #: Records kept in :attr:`request_log` (None: unbounded; a record is small).
    request_log_limit: int | None = None
    #: Requests kept in kmock's own list for its DSL assertions; each holds the raw request (~8 KiB).
    kmock_request_limit: int | None = 2_000
    #: Refuse namespaced objects in namespaces that do not exist, as the real server does.
    require_namespaces: bool = True
    server_version: str = "v1.33.0"

    faults: Faults = attrs.field(factory=Faults)
    request_log: list[RequestRecord] = attrs.field(factory=list)
    #: Optional authorization (see :mod:`agentrun.sandbox.kube_authz`): requests whose bearer token is a
    #: key here are checked by its authorizer and refused with 403; every other request is allowed.
    authorizers: dict[str, Authorizer] = attrs.field(factory=dict)
    #: One entry per request checked by an authorizer, allowed or not (bounded like request_log).
    decisions: list[Decision] = attrs.field(factory=list)
    #: Who a bearer token authenticates as (``request.userInfo`` of admission policies, SelfSubjectReview).
    #: Tokens not listed here act as their authorizer's user, else as ``kube-emulator`` (the admin).
    identities: dict[str, UserInfo] = attrs.field(factory=dict)
    #: Authorize impersonated requests as their target, with the Roles, ClusterRoles and bindings stored
    #: here (:mod:`agentrun.sandbox.kube_rbac`), as a real server does. Off by default: tests of the
    #: Kubernetes tools impersonate service accounts they grant nothing.
    authorize_impersonated_users: bool = False
    #: Text served by ``pods/log``, by ``(namespace, pod name)``: what a kubelet would answer.
    pod_logs: dict[tuple[str, str], str] = attrs.field(factory=dict)

    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    _versions: dict[StoreKey, list[ResourceType]] = attrs.field(factory=dict, init=False)
    _live: dict[StoreKey, dict[ObjKey, dict[str, Any]]] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=0, init=False)
    _history: dict[StoreKey, deque[StoredEvent]] = attrs.field(factory=dict, init=False)
    _compacted: dict[StoreKey, int] = attrs.field(factory=dict, init=False)
    _watchers: dict[StoreKey, set[Watcher]] = attrs.field(factory=dict, init=False)
    _uids: dict[str, tuple[StoreKey, ObjKey]] = attrs.field(factory=dict, init=False)
    _dependents: dict[str, set[tuple[StoreKey, ObjKey]]] = attrs.field(factory=dict, init=False)
    _orphaning: set[str] = attrs.field(factory=set, init=False)
    _ns_counts: Counter[str] = attrs.field(factory=Counter, init=False)
    _server_address: str = attrs.field(default="127.0.0.1:0", init=False)
    _pending: set[asyncio.Handle] = attrs.field(factory=set, init=False)
    _kmock_resources: dict[tuple[str, str, str], kmock.resource] = attrs.field(factory=dict, init=False)
    _served: int = attrs.field(default=0, init=False)
    #: The impersonation mode that last worked, by impersonator: the server tries it first next time.
    _impersonation_modes: dict[str, str] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        # Deliberately not calling super(): kmock's fallbacks would serve its naive store. Every Kubernetes
        # request is served by _handle() below; kmock's DSL remains available for user-defined reactions.
        for rtype in BUILTIN_TYPES:
            self.add_resource(rtype)
        for namespace in BUILTIN_NAMESPACES:
            self.create_object("namespaces", {"metadata": {"name": namespace}})

    # ----------------------------------------------------------------------------------------------------
    # Registry

    def add_resource(self, rtype: ResourceType) -> None:
        """Serve a resource type (CRDs do this automatically)."""
        self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
        versions = [t for t in self._versions.get(rtype.key, []) if t.version != rtype.version] + [rtype]
        versions.sort(key=lambda t: (not t.storage, t.preferred_order))
        self._versions[rtype.key] = versions
        self._live.setdefault(rtype.key, {})
        self._history.setdefault(rtype.key, deque())
        self.resources[self._kmock_resource(rtype)] = kmock.ResourceInfo(
            namespaced=rtype.namespaced,
            kind=rtype.kind,
            singular=rtype.singular or rtype.kind.lower(),
            verbs=set(rtype.verbs),
            shortnames=set(rtype.short_names),
            categories=set(rtype.categories),
            subresources=set(rtype.subresources),
        )

    def _remove_resource(self, key: StoreKey) -> None:
        for rtype in self._versions.pop(key, []):
            self._types.pop((rtype.group, rtype.version, rtype.plural), None)
            self.resources.pop(self._kmock_resource(rtype), None)
        for watcher in self._watchers.pop(key, set()):
            watcher.close()
        self._live.pop(key, None)

    def _kmock_resource(self, rtype: ResourceType) -> kmock.resource:
        key = (rtype.group, rtype.version, rtype.plural)
        resource = self._kmock_resources.get(key)
        if resource is None:
            resource = self._kmock_resources[key] = kmock.resource(*key)
        return resource

    def _storage_type(self, key: StoreKey) -> ResourceType:
        return self._versions[key][0]

    @property
    def resource_types(self) -> list[ResourceType]:
        return list(self._types.values())

    def resolve(self, resource: str) -> ResourceType:
        """Find a served type by ``plural``, ``plural.group``, ``group/plural``, ``group/version/plural``,
        ``v1/plural``, a short name or a kind; core types win over same-named ones in other groups."""
        group: str | None = None
        version: str | None = None
        name = resource
        if "/" in resource:
            parts = resource.split("/")
            name = parts[-1]
            if len(parts) == 3:
                group, version = parts[0], parts[1]
            elif re.fullmatch(r"v\d+\w*", parts[0]):
                group, version = "", parts[0]
            else:
                group = parts[0]
        elif "." in resource:
            name, group = resource.split(".", 1)
        lowered = name.lower()
        candidates = [
            t
            for t in self._types.values()
            if (group is None or t.group == group)
            and (version is None or t.version == version)
            and lowered in {t.plural, t.singular, t.kind.lower(), *t.short_names}
        ]
        if not candidates:
            raise KeyError(f"unknown resource: {resource}")
        candidates.sort(key=lambda t: (t.group != "", t.group, not t.storage, _version_priority(t.version)))
        return candidates[0]

    # ----------------------------------------------------------------------------------------------------
    # Public helpers for tests, benchmarks and the demo: no HTTP involved, the same semantics (they raise
    # ApiError where the server would answer an error) and private copies of the objects.

    def load_crd(self, source: Mapping[str, Any] | str | pathlib.Path) -> list[ResourceType]:
        """Create CRDs from a dict or a YAML file (all CRD documents in it); returns the served types."""
        docs: list[Any]
        if isinstance(source, Mapping):
            docs = [source]
        else:
            with open(source, encoding="utf-8") as fh:
                docs = list(yaml.safe_load_all(fh))
        loaded: list[ResourceType] = []
        for doc in docs:
            if not isinstance(doc, Mapping) or doc.get("kind") != "CustomResourceDefinition":
                continue
            name = _meta(doc).get("name", "")
            if self.get_object("customresourcedefinitions", None, name) is None:
                stored = self.create_object("customresourcedefinitions", doc)
            else:  # loading the same CRD again replaces it, like `kubectl replace`
                crds = self.resolve("customresourcedefinitions")
                stored = self._op_update(crds, None, name, dict(doc), None, {}).body
            spec = stored["spec"]
            loaded.extend(self._versions[(spec["group"], spec["names"]["plural"])])
        return loaded

    def create_object(
        self, resource: str, body: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        rtype = self.resolve(resource)
        namespace = (namespace or _meta(body).get("namespace")) if rtype.namespaced else None
        reply = self._op_create(rtype, namespace, dict(body), {})
        return dict(kube_patch.clone(reply.body))

    def get_object(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        rtype = self.resolve(resource)
        obj = self._live.get(rtype.key, {}).get((namespace if rtype.namespaced else None, name))
        return None if obj is None else dict(kube_patch.clone(self._present(rtype, obj)))

    def list_objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        rtype = self.resolve(resource)
        objs = self._live.get(rtype.key, {})
        return [
            dict(kube_patch.clone(self._present(rtype, o)))
            for k, o in sorted(objs.items(), key=_sort_key)
            if namespace in (None, k[0])
        ]

    def patch_object(
        self, resource: str, namespace: str | None, name: str, patch: Any, *, subresource: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch (a dict) or JSON-patch (a list) an object, e.g. to play a controller in a test."""
        rtype = self.resolve(resource)
        content_type = _MERGE if isinstance(patch, Mapping) else _JSON_PATCH
        reply = self._op_patch(rtype, namespace, name, patch, content_type, subresource, {})
        return dict(kube_patch.clone(reply.body))

    def delete_object(self, resource: str, namespace: str | None, name: str) -> None:
        rtype = self.resolve(resource)
        self._op_delete(rtype, namespace, name, {}, {})

    def set_pod_log(self, namespace: str, name: str, text: str) -> None:
        self.pod_logs[(namespace, name)] = text

    @property
    def resource_version(self) -> int:
        return self._rv

    def rbac_usage(self) -> set[tuple[str, str, str]]:
        """Every ``(apiGroup, resource[/subresource], verb)`` requested so far."""
        return {key for record in self.request_log if (key := record.rbac_key) is not None}

    def close(self) -> None:
        """End all watch streams (on shutdown), so the HTTP server can stop promptly."""
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.close()
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()

    # ----------------------------------------------------------------------------------------------------
    # HTTP entry

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Parse requests ourselves: kmock's URL parser fails on some valid paths (``/api/v1/namespaces``).

        Unexpected exceptions (emulator bugs) are answered with a 500 and, inside ``async with``, kept in
        ``errors`` (re-raised on exit when ``strict``), as kmock does.
        """
        try:
            self._served += 1
            if self.limit is not None and self._served > self.limit:
                raise RuntimeError("Too many requests have been served so far.")
            # The real API server reads bodies up to 3 MiB and answers 413 beyond; aiohttp stops at 1 MiB.
            raw_request = raw_request.clone(client_max_size=MAX_REQUEST_BYTES)
            try:
                request = await self._parse_request(raw_request)
            except aiohttp.web.HTTPRequestEntityTooLarge:
                message = f"Request entity too large: limit is {MAX_REQUEST_BYTES}"
                return aiohttp.web.json_response(
                    status_body(413, "RequestEntityTooLarge", message), status=413
                )
            self._requests.append(request)
            return await self._handle(request)
        except Exception as exc:
            if not self._errors:
                raise
            self._errors[-1].append(exc)
            logger.exception("kube emulator: internal error on %s %s", raw_request.method, raw_request.path)
            return await self._render_error(exc)

    async def _parse_request(self, raw: aiohttp.web.BaseRequest) -> kmock.Request:
        body = await raw.read()
        text = body.decode("utf-8", errors="replace")
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        route = parse_path(raw.path)
        query = dict(raw.query)
        resource = None
        if route.kind == "resource":
            key = (route.group or "", route.version or "", route.plural or "")
            resource = self._kmock_resources.get(key) or self._kmock_resources.setdefault(
                key, kmock.resource(*key)
            )
        verb = rbac_verb(raw.method, route, query)
        action = _ACTIONS.get(verb) if route.kind == "resource" else None
        return kmock.Request(
            id=self._served - 1,
            raw_request=raw,
            method=raw.method,
            url=raw.url,
            params=query,
            headers=dict(raw.headers),
            cookies=dict(raw.cookies),
            body=body,
            text=text,
            data=data,
            action=action,
            resource=resource,
            namespace=route.namespace,
            name=route.name,
            subresource=route.subresource,
        )

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        record = self._record(request)
        if self.authorizers and (denied := self._authorize(record, request.data)) is not None:
            return self._respond(record, Reply(denied.code, denied.body()))
        impersonated = self.authorize_impersonated_users and record.impersonate_user
        if impersonated and (denied := self._authorize_as_target(record, request.data)) is not None:
            return self._respond(record, Reply(denied.code, denied.body()))
        fault = self.faults.take_fault(record)
        if fault is not None:
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.status is not None:
                headers = {"Retry-After": str(max(1, int(fault.retry_after)))} if fault.retry_after else {}
                return self._respond(record, Reply(fault.status, fault.status_body(), headers=headers))
        if self._payloads:  # user-defined kmock reactions first (they are slow: kmock scans all requests)
            try:
                response = await super(kmock.KubernetesScaffold, self)._handle(request)
            except NotImplementedError:
                pass
            else:
                record.status = response.status
                return response
        try:
            body = request.body
            result = self._serve(record, body, request.headers)
        except ApiError as exc:
            result = Reply(exc.code, exc.body(), headers=exc.headers)
        except SelectorError as exc:
            result = Reply(400, status_body(400, "BadRequest", str(exc)))
        if isinstance(result, _WatchPlan):
            return await self._stream(request, record, result)
        return self._respond(record, result)

    def _record(self, request: kmock.Request) -> RequestRecord:
        raw = request._raw_request
        headers: Mapping[str, str] = raw.headers if raw is not None else request.headers
        path = request.url.path
        query = dict(request.params)
        route = parse_path(path)
        groups: list[str] = list(raw.headers.getall("Impersonate-Group", [])) if raw is not None else []
        record = RequestRecord(
            method=request.method.value.upper(),
            path=path,
            query=query,
            verb=rbac_verb(request.method.value, route, query),
            group=route.group if route.kind == "resource" else None,
            version=route.version if route.kind == "resource" else None,
            resource=route.plural,
            subresource=route.subresource,
            namespace=route.namespace,
            name=route.name,
            content_type=_header(headers, "Content-Type"),
            impersonate_user=_header(headers, "Impersonate-User"),
            impersonate_groups=tuple(groups),
            authorization=_header(headers, "Authorization"),
            user_agent=_header(headers, "User-Agent"),
            route=route,
        )
        self.request_log.append(record)
        # Trim in chunks: deleting from the head of a list is linear in its length.
        if self.request_log_limit is not None and len(self.request_log) > self.request_log_limit * 1.1 + 10:
            del self.request_log[: len(self.request_log) - self.request_log_limit]
        if self.kmock_request_limit is not None and len(self._requests) > self.kmock_request_limit * 1.1 + 10:
            del self._requests[: len(self._requests) - self.kmock_request_limit]
        return record

    def _authorize(self, record: RequestRecord, body: Any) -> ApiError | None:
        """The 403 for a request its token's authorizer refuses; None when allowed or unrestricted."""
        token = (record.authorization or "").removeprefix("Bearer ").strip()
        authorizer = self.authorizers.get(token)
        if authorizer is None:
            return None
        checks = attributes_of(record, authorizer.user, body, self._resolve_kind)
        if record.impersonate_user:
            return self._authorize_impersonation(record, authorizer, checks)
        refused = next((check for check in checks if not authorizer.allows(check)), None)
        self._decided(Decision(record, tuple(checks), refused is None))
        return forbidden(refused) if refused is not None else None

    def _authorize_impersonation(
        self, record: RequestRecord, authorizer: Authorizer, legacy: list[Attributes]
    ) -> ApiError | None:
        """Legacy or constrained impersonation, in the order kube-apiserver v1.36 tries them."""
        modes = {**constrained_impersonation(record, authorizer.user), "legacy": legacy}
        remembered = self._impersonation_modes.get(authorizer.user)
        order = sorted(modes, key=lambda mode: mode != remembered)  # stable: constrained before legacy
        asked: list[Attributes] = []
        first_refusal: Attributes | None = None
        for mode in order:
            refused = None
            for check in modes[mode]:
                asked.append(check)
                if not authorizer.allows(check):
                    refused = check
                    break
            if refused is None:
                self._impersonation_modes[authorizer.user] = mode
                self._decided(Decision(record, tuple(asked), True))
                return None
            first_refusal = first_refusal or refused
        self._decided(Decision(record, tuple(asked), False))
        assert first_refusal is not None
        return forbidden(first_refusal)

    def _decided(self, decision: Decision) -> None:
        self.decisions.append(decision)
        if self.request_log_limit is not None and len(self.decisions) > self.request_log_limit * 1.1 + 10:
            del self.decisions[: len(self.decisions) - self.request_log_limit]

    def _authorize_as_target(self, record: RequestRecord, body: Any) -> ApiError | None:
        """The 403 for an impersonated request its target's stored RBAC does not allow."""
        target = identify(record, self.identities, self.authorizers)
        rbac = RbacObjects(
            roles=self.list_objects("roles.rbac.authorization.k8s.io"),
            cluster_roles=self.list_objects("clusterroles.rbac.authorization.k8s.io"),
            role_bindings=self.list_objects("rolebindings.rbac.authorization.k8s.io"),
            cluster_role_bindings=self.list_objects("clusterrolebindings.rbac.authorization.k8s.io"),
        )
        for check in own_attributes(record, target.username, body, self._resolve_kind):
            if not rbac.allows(check, target.groups):
                return forbidden(check)
        return None

    def _resolve_kind(self, api_version: str, kind: str) -> tuple[str, str] | None:
        group = api_version.rpartition("/")[0]
        for rtype in self._types.values():
            if rtype.group == group and rtype.kind == kind:
                return rtype.group, rtype.plural
        return None

    def _respond(self, record: RequestRecord, reply: Reply) -> aiohttp.web.Response:
        record.status = reply.status
        if reply.text is not None:
            response = aiohttp.web.Response(status=reply.status, text=reply.text, content_type="text/plain")
        else:
            body = json.dumps(reply.body, separators=(",", ":")).encode()
            response = aiohttp.web.Response(status=reply.status, body=body, content_type="application/json")
        for name, value in reply.headers.items():
            response.headers[name] = value
        for warning in reply.warnings:
            response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        if reply.status >= 400:
            logger.debug(
                "kube emulator: %s %s -> %s %s", record.method, record.path, reply.status, reply.body
            )
        return response

    def _serve(self, record: RequestRecord, body: bytes, headers: Mapping[str, str]) -> Reply | _WatchPlan:
        route = record.route
        if route.kind == "other":
            return self._serve_other(route, record)
        if route.kind == "discovery":
            return self._serve_discovery(route)
        rtype = self._types.get((route.group or "", route.version or "", route.plural or ""))
        if rtype is None or not rtype.served:
            raise ApiError.no_route()
        if route.namespace is not None and not rtype.namespaced:
            raise ApiError.no_route()
        if rtype.namespaced and route.namespace is None and record.verb not in ("list", "watch"):
            raise ApiError.no_route()
        sub = route.subresource
        if sub is not None and sub not in rtype.subresources:
            raise ApiError.no_route()
        verb = record.verb
        query = record.query
        accept = _header(headers, "Accept")
        content_type = _header(headers, "Content-Type")
        allowed = {"status": {"get", "update", "patch"}, "log": {"get"}, "finalize": {"update"}}
        if (sub is not None and verb not in allowed.get(sub, set())) or verb not in rtype.verbs:
            raise ApiError.method_not_allowed()
        namespace, name = route.namespace, route.name
        user = identify(record, self.identities, self.authorizers)
        if rtype.key == _SELF_SUBJECT_REVIEWS:
            return self._self_subject_review(rtype, user)  # any body: nothing in it matters
        match verb:
            case "get" if sub == "log":
                return self._serve_log(namespace or "", name or "", query)
            case "get":
                obj = self._get(rtype, namespace, name or "")
                if kube_tables.wants_table(accept):
                    return Reply(
                        200, kube_tables.as_table(rtype, [obj], str(self._rv), include_object=_include(query))
                    )
                return Reply(200, obj)
            case "list":
                return self._op_list(rtype, namespace, query, table=kube_tables.wants_table(accept))
            case "watch":
                return self._plan_watch(rtype, namespace, name, query, table=kube_tables.wants_table(accept))
            case "create":
                if name is not None:
                    raise ApiError.method_not_allowed()
                return self._op_create(rtype, namespace, decode_body(body, content_type), query, user)
            case "update":
                return self._op_update(
                    rtype, namespace, name or "", decode_body(body, content_type), sub, query, user
                )
            case "patch":
                patch_type = (content_type or "").split(";")[0].strip().lower()
                accepted = (
                    (_MERGE, _JSON_PATCH, _STRATEGIC) if rtype.strategic_merge else (_MERGE, _JSON_PATCH)
                )
                if patch_type not in accepted:  # server-side apply included
                    raise _unsupported_media(rtype, patch_type)
                return self._op_patch(
                    rtype, namespace, name or "", decode_body(body, None), patch_type, sub, query, user
                )
            case "delete":
                options = decode_body(body, content_type) or {}
                return self._op_delete(
                    rtype, namespace, name or "", options if isinstance(options, dict) else {}, query
                )
            case "deletecollection":
                options = decode_body(body, content_type) or {}
                return self._op_delete_collection(
                    rtype, namespace, options if isinstance(options, dict) else {}, query
                )
        raise ApiError.method_not_allowed()

    def _serve_other(self, route: ApiRoute, record: RequestRecord) -> Reply:
        path = record.path.rstrip("/") or "/"
        if path == "/version" and record.method == "GET":
            major, minor = re.findall(r"\d+", self.server_version)[:2]
            return Reply(
                200,
                {
                    "major": major,
                    "minor": minor,
                    "gitVersion": self.server_version,
                    "gitCommit": "kube-emulator",
                    "gitTreeState": "clean",
                    "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.24",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        if path in ("/healthz", "/livez", "/readyz"):
            return Reply(200, text="ok")
        if path == "/openapi/v3":
            return Reply(200, kube_openapi.index(t for t in self._types.values() if t.served))
        if path.startswith("/openapi/v3/"):
            doc_path = path.removeprefix("/openapi/v3/")
            members = [t for t in self._types.values() if t.served and kube_openapi._doc_path(t) == doc_path]
            if members:
                return Reply(200, kube_openapi.document(members))
        if path == "/":
            paths = {"/api", "/api/v1", "/apis", "/version", "/healthz", "/livez", "/readyz"}
            paths |= {f"/apis/{t.group}" for t in self._types.values() if t.group}
            paths |= {f"/apis/{t.group_version}" for t in self._types.values() if t.group}
            return Reply(200, {"paths": sorted(paths)})
        raise ApiError.no_route()

    # ----------------------------------------------------------------------------------------------------
    # Discovery

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, set[str]] = {}
        for rtype in self._types.values():
            if rtype.served:
                groups.setdefault(rtype.group, set()).add(rtype.version)
        return {g: sorted(vs, key=_version_priority) for g, vs in groups.items()}

    def _serve_discovery(self, route: ApiRoute) -> Reply:
        groups = self._groups()
        if route.group == "" and route.version is None:
            return Reply(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self._server_address}
                    ],
                },
            )
        if route.group is None:
            return Reply(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [_api_group(g, vs) for g, vs in sorted(groups.items()) if g],
                },
            )
        if route.group not in groups or (
            route.version is not None and route.version not in groups[route.group]
        ):
            raise ApiError.no_route()
        if route.version is None:
            return Reply(
                200, {"kind": "APIGroup", "apiVersion": "v1", **_api_group(route.group, groups[route.group])}
            )
        resources = [
            entry
            for rtype in sorted(self._types.values(), key=lambda t: t.plural)
            if rtype.group == route.group and rtype.version == route.version and rtype.served
            for entry in rtype.discovery()
        ]
        group_version = f"{route.group}/{route.version}" if route.group else route.version
        return Reply(
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            },
        )

    # ----------------------------------------------------------------------------------------------------
    # Reads

    def _present(self, rtype: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Show a stored object as the requested version (conversion strategy None: only apiVersion)."""
        if obj.get("apiVersion") == rtype.api_version:
            return dict(obj)
        return {**obj, "apiVersion": rtype.api_version}

    def _get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._live.get(rtype.key, {}).get((namespace, name))
        if obj is None:
            raise ApiError.not_found(rtype.group, rtype.plural, name)
        return self._present(rtype, obj)

    def _field_selector(self, rtype: ResourceType, text: str | None) -> FieldSelector:
        if not rtype.custom:
            return FieldSelector.parse(text)
        allowed = {"metadata.name", "metadata.namespace", *rtype.selectable_fields}
        return FieldSelector.parse(text, allowed)

    def _selected(
        self, rtype: ResourceType, namespace: str | None, query: Mapping[str, str]
    ) -> list[tuple[ObjKey, dict[str, Any]]]:
        labels = LabelSelector.parse(query.get("labelSelector"))
        fields = self._field_selector(rtype, query.get("fieldSelector"))
        items = self._live.get(rtype.key, {})
        selected = [
            (key, obj)
            for key, obj in items.items()
            if (namespace is None or key[0] == namespace)
            and labels.matches(_meta(obj).get("labels"))
            and fields.matches(obj)
        ]
        selected.sort(key=_sort_key)
        return selected

    def _op_list(
        self, rtype: ResourceType, namespace: str | None, query: Mapping[str, str], *, table: bool
    ) -> Reply:
        selected = self._selected(rtype, namespace, query)
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        if token := query.get("continue"):
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
            except ValueError:
                raise ApiError.bad_request("continue key is not valid") from None
            selected = [(k, o) for k, o in selected if (k[0] or "", k[1]) > (after[0] or "", after[1])]
        limit = int(query.get("limit") or 0)
        if limit > 0 and len(selected) > limit:
            last = selected[limit - 1][0]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(list(last)).encode()).decode()
            meta["remainingItemCount"] = len(selected) - limit
            selected = selected[:limit]
        items = [self._present(rtype, obj) for _, obj in selected]
        if table:
            return Reply(
                200, kube_tables.as_table(rtype, items, str(self._rv), include_object=_include(query))
            )
        return Reply(
            200, {"kind": rtype.list_kind, "apiVersion": rtype.api_version, "metadata": meta, "items": items}
        )

    def _serve_log(self, namespace: str, name: str, query: Mapping[str, str]) -> Reply:
        """What kube-apiserver answers (the container checked first), with :attr:`pod_logs` as the kubelet.

        A pod no node runs has an empty log; one bound to a node reaches that node's kubelet, and with no
        log registered here there is none: the server then fails to find the Node, and says so in its
        own words (``pods "NODE" not found``, as a real server with no such Node does).
        """
        pods = self._types[("", "v1", "pods")]
        pod = self._get(pods, namespace, name)
        spec = pod.get("spec") or {}
        names = [
            str(c.get("name"))
            for key in ("initContainers", "containers", "ephemeralContainers")
            for c in spec.get(key) or ()
        ]
        container = query.get("container")
        if container and container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {name}")
        if not container and len(spec.get("containers") or ()) > 1:  # none: a real server refuses the pod
            choices = " ".join(names)
            raise ApiError.bad_request(
                f"a container name must be specified for pod {name}, choose one of: [{choices}]"
            )
        node = spec.get("nodeName")
        if node and (namespace, name) not in self.pod_logs:
            raise ApiError(404, "NotFound", f'pods "{node}" not found', {"name": node, "kind": "pods"})
        text = self.pod_logs.get((namespace, name), "")
        if tail := query.get("tailLines"):
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) > 0 else ""
        return Reply(200, text=text)

    # ----------------------------------------------------------------------------------------------------
    # Watches

    def _plan_watch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str | None,
        query: Mapping[str, str],
        *,
        table: bool,
    ) -> _WatchPlan:
        labels = LabelSelector.parse(query.get("labelSelector"))
        fields = self._field_selector(rtype, query.get("fieldSelector"))
        watcher = Watcher(rtype, namespace=namespace, name=name, labels=labels, fields=fields)
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        since = query.get("resourceVersion") or ""
        initial: list[tuple[str, Mapping[str, Any]]] = []
        if truthy(query.get("sendInitialEvents")) or since in ("", "0"):
            initial = [
                ("ADDED", obj)
                for _, obj in sorted(self._live[rtype.key].items(), key=_sort_key)
                if watcher.matches(obj)
            ]
            if truthy(query.get("sendInitialEvents")):
                bookmark = {
                    "kind": rtype.kind,
                    "apiVersion": rtype.api_version,
                    "metadata": {
                        "resourceVersion": str(self._rv),
                        "annotations": {_INITIAL_EVENTS_END: "true"},
                    },
                }
                initial.append(("BOOKMARK", bookmark))
        else:
            try:
                since_rv = int(since)
            except ValueError:
                raise ApiError.bad_request(f"invalid resource version: {since}") from None
            compacted = self._compacted.get(rtype.key, 0)
            if since_rv < compacted:
                message = f"too old resource version: {since_rv} ({compacted})"
                return _WatchPlan(
                    rtype, None, [], timeout, table, expired=status_body(410, "Expired", message)
                )
            for event in self._history[rtype.key]:
                if event.rv > since_rv and (translated := watcher.translate(event)) is not None:
                    initial.append(translated)
        self._watchers.setdefault(rtype.key, set()).add(watcher)
        return _WatchPlan(rtype, watcher, initial, timeout, table)

    async def _stream(
        self, request: kmock.Request, record: RequestRecord, plan: _WatchPlan
    ) -> aiohttp.web.StreamResponse:
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "application/json"
        record.status = 200
        drop = self.faults.take_watch_drop(record)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + plan.timeout if plan.timeout is not None else None
        drop_at = (
            loop.time() + drop.after_seconds if drop is not None and drop.after_seconds is not None else None
        )
        sent = 0
        dropped = False

        async def emit(kind: str, obj: Mapping[str, Any]) -> None:
            if plan.table and kind != "ERROR" and kind != "BOOKMARK":
                payload: Mapping[str, Any] = kube_tables.as_table(
                    plan.rtype, [self._present(plan.rtype, obj)], str(self._rv)
                )
            else:
                payload = self._present(plan.rtype, obj) if kind != "ERROR" else obj
            await response.write(
                json.dumps({"type": kind, "object": payload}, separators=(",", ":")).encode() + b"\n"
            )

        try:
            await response.prepare(request._raw_request)
            if plan.expired is not None:
                await emit("ERROR", plan.expired)
                return response
            pending: deque[tuple[str, Mapping[str, Any]] | None] = deque(plan.initial)
            while True:
                if drop is not None and drop.after_events is not None and sent >= drop.after_events:
                    dropped = True
                    break
                if pending:
                    item = pending.popleft()
                else:
                    now = loop.time()
                    ends = [t for t in (deadline, drop_at) if t is not None]
                    wait = min(ends) - now if ends else None
                    if wait is not None and wait <= 0:
                        dropped = drop_at is not None and now >= drop_at
                        break
                    assert plan.watcher is not None
                    try:
                        item = await asyncio.wait_for(plan.watcher.queue.get(), wait)
                    except TimeoutError:
                        continue
                if item is None:
                    break
                await emit(*item)
                sent += 1
            if dropped and drop is not None and drop.expire:
                await emit(
                    "ERROR", status_body(410, "Expired", f"too old resource version: {self._rv} ({self._rv})")
                )
        except ConnectionError:
            pass
        finally:
            if plan.watcher is not None:
                self._watchers.get(plan.rtype.key, set()).discard(plan.watcher)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response

    # ----------------------------------------------------------------------------------------------------
    # Writes: common machinery

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _emit(
        self, key: StoreKey, kind: str, old: Mapping[str, Any] | None, new: Mapping[str, Any], rv: int
    ) -> None:
        event = StoredEvent(rv, kind, old, new)
        history = self._history[key]
        history.append(event)
        while len(history) > self.watch_history_limit:
            self._compacted[key] = history.popleft().rv
        for watcher in list(self._watchers.get(key, ())):
            watcher.offer(event)

    def _mirror(self, rtype: ResourceType, okey: ObjKey, obj: Mapping[str, Any] | None) -> None:
        """Keep kmock's ``objects`` view (with history) in step, for assertions in tests."""
        storage = self._storage_type(rtype.key)
        key = (self._kmock_resource(storage), okey[0], okey[1])
        if key in self.objects:
            history = self.objects[key].history
            history.append(None if obj is None else dict(obj))
            if self.history_limit is not None and len(history) > self.history_limit:
                del history[: len(history) - self.history_limit]
        elif obj is not None:
            self.objects[key] = dict(obj)

    def _index(
        self, key: StoreKey, okey: ObjKey, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> None:
        old_owners = _owner_uids(old) if old is not None else set()
        new_owners = _owner_uids(new) if new is not None else set()
        for uid in old_owners - new_owners:
            dependents = self._dependents.get(uid)
            if dependents is not None:
                dependents.discard((key, okey))
                if not dependents:
                    del self._dependents[uid]
        for uid in new_owners - old_owners:
            self._dependents.setdefault(uid, set()).add((key, okey))
            if uid not in self._uids:
                # The real garbage collector also removes dependents whose owner is already gone
                # (e.g. written by a controller that raced the owner's deletion).
                self._later(self._collect_garbage, uid)
        if old is None and new is not None:
            self._uids[_meta(new)["uid"]] = (key, okey)
            if okey[0] is not None:
                self._ns_counts[okey[0]] += 1
        elif old is not None and new is None:
            self._uids.pop(_meta(old).get("uid", ""), None)
            if okey[0] is not None:
                self._ns_counts[okey[0]] -= 1
                if self._ns_counts[okey[0]] <= 0:
                    del self._ns_counts[okey[0]]

    def _store(
        self, rtype: ResourceType, okey: ObjKey, old: dict[str, Any] | None, new: dict[str, Any]
    ) -> dict[str, Any]:
        """Persist a created or changed object under a new resourceVersion and tell the watchers."""
        storage = self._storage_type(rtype.key)
        new["apiVersion"] = storage.api_version
        rv = self._next_rv()
        new["metadata"]["resourceVersion"] = str(rv)
        self._live[rtype.key][okey] = new
        self._index(rtype.key, okey, old, new)
        self._mirror(rtype, okey, new)
        self._emit(rtype.key, "ADDED" if old is None else "MODIFIED", old, new, rv)
        return new

    def _drop(
        self, rtype: ResourceType, okey: ObjKey, old: dict[str, Any], *, orphan: bool = False
    ) -> dict[str, Any]:
        """Remove an object for good; its dependents are garbage-collected in the background."""
        rv = self._next_rv()
        final = {**old, "metadata": {**old["metadata"], "resourceVersion": str(rv)}}
        del self._live[rtype.key][okey]
        self._index(rtype.key, okey, old, None)
        self._mirror(rtype, okey, None)
        self._emit(rtype.key, "DELETED", old, final, rv)
        uid = _meta(old).get("uid", "")
        if uid in self._dependents:
            if orphan or uid in self._orphaning:
                self._orphan(uid)
            else:
                self._later(self._collect_garbage, uid)
        self._orphaning.discard(uid)
        self._after_drop(rtype, okey, final)
        return final

    def _later(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a controller step after the current request, as the real controllers run asynchronously."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            fn(*args)
            return
        handle: asyncio.Handle

        def run() -> None:
            self._pending.discard(handle)
            fn(*args)

        handle = loop.call_soon(run)
        self._pending.add(handle)

    def _after_drop(self, rtype: ResourceType, okey: ObjKey, final: Mapping[str, Any]) -> None:
        namespace = okey[0]
        if namespace is not None and namespace not in self._ns_counts:
            self._later(self._finish_namespace, namespace)
        if rtype.custom:
            crd_name = f"{rtype.plural}.{rtype.group}"
            crd = self._live[("apiextensions.k8s.io", "customresourcedefinitions")].get((None, crd_name))
            if crd is not None and _meta(crd).get("deletionTimestamp") and not self._live.get(rtype.key):
                self._later(self._finish_crd, crd_name)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            spec = final.get("spec") or {}
            self._remove_resource((spec.get("group", ""), (spec.get("names") or {}).get("plural", "")))

    def _finalize_if_released(
        self, rtype: ResourceType, okey: ObjKey, obj: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Remove an object whose deletion was pending once nothing holds it any more."""
        meta = _meta(obj)
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return None
        spec_finalizers = (obj.get("spec") or {}).get("finalizers")
        if rtype.key == ("", "namespaces") and spec_finalizers and okey[1] in self._ns_counts:
            return None
        return self._drop(rtype, okey, obj)

    # ----------------------------------------------------------------------------------------------------
    # Controllers the real control plane runs: garbage collector, namespace and CRD finalizers

    def _collect_garbage(self, owner_uid: str) -> None:
        for key, okey in sorted(
            self._dependents.pop(owner_uid, set()), key=lambda d: (d[0], d[1][0] or "", d[1][1])
        ):
            obj = self._live.get(key, {}).get(okey)
            if obj is None:
                continue
            rtype = self._storage_type(key)
            alive = {uid for uid in _owner_uids(obj) if uid in self._uids}
            if alive:
                self._strip_owner(rtype, okey, obj, owner_uid)
            else:
                self._delete_stored(rtype, okey, obj, propagation="Background")

    def _orphan(self, owner_uid: str) -> None:
        for key, okey in list(self._dependents.pop(owner_uid, set())):
            obj = self._live.get(key, {}).get(okey)
            if obj is not None:
                self._strip_owner(self._storage_type(key), okey, obj, owner_uid)

    def _strip_owner(self, rtype: ResourceType, okey: ObjKey, obj: dict[str, Any], owner_uid: str) -> None:
        new = kube_patch.clone(obj)
        refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        self._store(rtype, okey, obj, new)

    def _sweep_namespace(self, namespace: str) -> None:
        for key, objects in list(self._live.items()):
            rtype = self._storage_type(key)
            if not rtype.namespaced:
                continue
            for okey, obj in sorted(objects.items(), key=_sort_key):
                if okey[0] == namespace and not _meta(obj).get("deletionTimestamp"):
                    self._delete_stored(rtype, okey, obj, propagation="Background")
        self._finish_namespace(namespace)

    def _finish_namespace(self, namespace: str) -> None:
        namespaces = self._storage_type(("", "namespaces"))
        obj = self._live[namespaces.key].get((None, namespace))
        if obj is None or not _meta(obj).get("deletionTimestamp") or namespace in self._ns_counts:
            return
        if (obj.get("spec") or {}).get("finalizers"):
            new = kube_patch.clone(obj)
            new["spec"]["finalizers"] = []
            obj = self._store(namespaces, (None, namespace), obj, new)
        self._finalize_if_released(namespaces, (None, namespace), obj)

    def _sweep_crd(self, crd_name: str) -> None:
        crds = self._storage_type(("apiextensions.k8s.io", "customresourcedefinitions"))
        crd = self._live[crds.key].get((None, crd_name))
        if crd is None:
            return
        key = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        if key in self._versions:
            rtype = self._storage_type(key)
            for okey, obj in sorted(self._live.get(key, {}).items(), key=_sort_key):
                if not _meta(obj).get("deletionTimestamp"):
                    self._delete_stored(rtype, okey, obj, propagation="Background")
        self._finish_crd(crd_name)

    def _finish_crd(self, crd_name: str) -> None:
        crds = self._storage_type(("apiextensions.k8s.io", "customresourcedefinitions"))
        crd = self._live[crds.key].get((None, crd_name))
        if crd is None or not _meta(crd).get("deletionTimestamp"):
            return
        key = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        if self._live.get(key):
            return
        finalizers = _meta(crd).get("finalizers") or []
        if CRD_CLEANUP_FINALIZER in finalizers:
            new = kube_patch.clone(crd)
            new["metadata"]["finalizers"] = [f for f in finalizers if f != CRD_CLEANUP_FINALIZER]
            if not new["metadata"]["finalizers"]:
                del new["metadata"]["finalizers"]
            crd = self._store(crds, (None, crd_name), crd, new)
        self._finalize_if_released(crds, (None, crd_name), crd)

    # ----------------------------------------------------------------------------------------------------
    # Writes: verbs

    def _invalid(self, rtype: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
        return ApiError.invalid(rtype.group, rtype.kind, name, errors)

    def _check_meta(self, rtype: ResourceType, obj: Mapping[str, Any], errors: list[FieldError]) -> None:
        meta = _meta(obj)
        name = meta.get("name", "")
        for detail in _name_problems(name, label=rtype.key == ("", "namespaces")):
            errors.append(FieldError("FieldValueInvalid", "metadata.name", name, detail))
        for field_name, value, detail in label_problems(meta.get("labels"), "metadata.labels"):
            errors.append(FieldError("FieldValueInvalid", field_name, value, detail))
        annotations = meta.get("annotations")
        if annotations is not None:
            if not isinstance(annotations, Mapping) or not all(
                isinstance(v, str) for v in annotations.values()
            ):
                errors.append(
                    FieldError(
                        "FieldValueInvalid", "metadata.annotations", "", "annotation values must be strings"
                    )
                )
            elif sum(len(k) + len(v) for k, v in annotations.items()) > 256 * 1024:
                errors.append(
                    FieldError("FieldValueTooLong", "metadata.annotations", "", kube_schema.too_long(262144))
                )
        for index, ref in enumerate(meta.get("ownerReferences") or []):
            for required in ("apiVersion", "kind", "name", "uid"):
                if not isinstance(ref, Mapping) or not ref.get(required):
                    errors.append(
                        FieldError("FieldValueRequired", f"metadata.ownerReferences[{index}].{required}")
                    )
        controllers = [
            r for r in meta.get("ownerReferences") or [] if isinstance(r, Mapping) and r.get("controller")
        ]
        if len(controllers) > 1:
            errors.append(
                FieldError(
                    "FieldValueInvalid",
                    "metadata.ownerReferences",
                    "",
                    "Only one reference can have Controller set to true",
                )
            )
        finalizers = meta.get("finalizers")
        if finalizers is not None and (
            not isinstance(finalizers, list) or not all(isinstance(f, str) and f for f in finalizers)
        ):
            errors.append(
                FieldError(
                    "FieldValueInvalid", "metadata.finalizers", "", "finalizers must be non-empty strings"
                )
            )

    def _admit(
        self,
        rtype: ResourceType,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        query: Mapping[str, str],
        *,
        subresource: str | None = None,
    ) -> list[str]:
        """Prune, default and validate ``obj`` in place; return the warnings for pruned fields."""
        schema = rtype.schema if rtype.custom else None
        pruned = kube_schema.prune(obj, schema)
        if pruned and query.get("fieldValidation") == "Strict":
            unknown = ", ".join(f'unknown field "{p}"' for p in pruned)
            version = str(obj.get("apiVersion") or rtype.version).rpartition("/")[2]
            raise ApiError.bad_request(
                f'{rtype.kind} in version "{version}" cannot be handled as a {rtype.kind}: '
                f"strict decoding error: {unknown}"
            )
        kube_schema.apply_defaults(obj, schema)
        errors: list[FieldError] = []
        self._check_meta(rtype, obj, errors)
        if schema is not None:
            old_obj = kube_schema._MISSING if old is None else old
            body_root = "status" if subresource == "status" else ""
            errors += kube_schema.validate(obj, schema, old_obj, prior=errors, body_root=body_root)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            errors += crd_problems(obj)
        elif rtype.key == kube_admission.POLICIES:
            kube_admission.default_policy(obj)
            errors += kube_admission.policy_problems(obj)
        elif rtype.key == kube_admission.BINDINGS:
            kube_admission.default_binding(obj)
            errors += kube_admission.binding_problems(obj)
        elif rtype.key == ("", "events"):
            errors += _event_problems(obj)
        if errors:
            raise self._invalid(rtype, _meta(obj).get("name", ""), errors)
        return [f'unknown field "{p}"' for p in pruned]

    def _op_create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: Any,
        query: Mapping[str, str],
        user: UserInfo = EMULATOR_ADMIN,
    ) -> Reply:
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body of the request was in an unknown format")
        obj = kube_patch.clone(body)
        self._check_kind(rtype, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        if meta.get("resourceVersion"):
            raise ApiError(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
            )
        if rtype.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or meta.get("namespace")
            if not namespace:
                raise ApiError.no_route()
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
            namespace = None
        for key in _SYSTEM_META:
            meta.pop(key, None)
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                error = FieldError(
                    "FieldValueRequired", "metadata.name", detail="name or generateName is required"
                )
                raise self._invalid(rtype, "", [error])
            for _ in range(8):
                meta["name"] = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
                if (namespace, meta["name"]) not in self._live[rtype.key]:
                    break
        name = meta["name"]
        if namespace is not None:
            self._check_namespace_open(rtype, namespace, name)
        if rtype.custom and rtype.status_subresource:
            obj.pop("status", None)
        self._prepare_special_create(rtype, obj)
        warnings = self._admit(rtype, obj, None, query)
        warnings += self._validating_admission("CREATE", rtype, obj, None, None, user, query)
        if (namespace, name) in self._live[rtype.key]:
            raise ApiError.already_exists(rtype.group, rtype.plural, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if rtype.generation:
            meta["generation"] = 1
        if _dry_run(query):
            meta["resourceVersion"] = ""
            return Reply(201, self._present(rtype, obj), warnings=warnings)
        stored = self._store(rtype, (namespace, name), None, obj)
        self._after_write(rtype, None, stored)
        return Reply(201, self._present(rtype, stored), warnings=warnings)

    def _validating_admission(
        self,
        operation: str,
        rtype: ResourceType,
        obj: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        subresource: str | None,
        user: UserInfo,
        query: Mapping[str, str],
    ) -> list[str]:
        """ValidatingAdmissionPolicies on a write that passed validation: warnings, or the denial raised."""
        policies = list(self._live.get(kube_admission.POLICIES, {}).values())
        if not policies:
            return []
        meta = _meta(obj)
        namespace = meta.get("namespace") if rtype.namespaced else None
        request = kube_admission.AdmissionRequest(
            operation=operation,
            group=rtype.group,
            version=rtype.version,
            resource=rtype.plural,
            subresource=subresource or "",
            kind=rtype.kind,
            namespaced=rtype.namespaced,
            namespace=namespace,
            name=meta.get("name") or meta.get("generateName") or "",
            obj=obj,
            old=old,
            user=user,
            namespace_object=self._live[("", "namespaces")].get((None, namespace)) if namespace else None,
            dry_run=_dry_run(query),
        )
        bindings = self._live.get(kube_admission.BINDINGS, {}).values()
        verdict = kube_admission.evaluate(policies, bindings, request)
        if verdict.denial is not None:
            raise verdict.denial
        return list(verdict.warnings)

    def _self_subject_review(self, rtype: ResourceType, user: UserInfo) -> Reply:
        """``kubectl auth whoami``: who the request authenticated as; nothing is stored."""
        review = {
            "kind": rtype.kind,
            "apiVersion": rtype.api_version,
            "metadata": {"creationTimestamp": _now()},
            "status": {"userInfo": user.as_dict()},
        }
        return Reply(201, review)

    def _check_kind(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        kind = obj.setdefault("kind", rtype.kind)
        if kind != rtype.kind:
            raise ApiError.bad_request(
                f"the kind of the provided object ({kind}) does not match the resource ({rtype.kind})"
            )
        api_version = obj.setdefault("apiVersion", rtype.api_version)
        versions = {t.api_version for t in self._versions.get(rtype.key, [])}
        if api_version not in versions:
            raise ApiError.bad_request(
                f"the API version in the data ({api_version}) does not match "
                f"the expected API version ({rtype.api_version})"
            )
        obj["apiVersion"] = rtype.api_version

    def _check_namespace_open(self, rtype: ResourceType, namespace: str, name: str) -> None:
        ns = self._live[("", "namespaces")].get((None, namespace))
        if ns is None:
            if self.require_namespaces:
                raise ApiError.not_found("", "namespaces", namespace)
            return
        if _meta(ns).get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f'{rtype.qualified_resource} "{name}" is forbidden: unable to create new content in '
                f"namespace {namespace} because it is being terminated",
                {"name": name, "group": rtype.group, "kind": rtype.plural},
            )

    def _prepare_special_create(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        if rtype.key == ("", "namespaces"):
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
            obj["status"] = {"phase": "Active"}
            _label_namespace(obj)
        elif rtype.key == ("", "pods"):
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        elif rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            problems = crd_problems(obj)
            if problems:
                raise self._invalid(rtype, _meta(obj).get("name", ""), problems)
            spec = obj["spec"]
            crd_name = f"{spec['names']['plural']}.{spec['group']}"
            crd_key = (spec["group"], spec["names"]["plural"])
            if crd_key in self._versions and not any(t.custom for t in self._versions[crd_key]):
                raise ApiError.already_exists(rtype.group, rtype.plural, crd_name)
            meta = obj["metadata"]
            meta["finalizers"] = [*(meta.get("finalizers") or []), CRD_CLEANUP_FINALIZER]
            obj["status"] = _crd_status(obj)

    def _after_write(
        self, rtype: ResourceType, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> None:
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions") and not _meta(new).get(
            "deletionTimestamp"
        ):
            for served in types_from_crd(new):
                self.add_resource(served)
            key = (new["spec"]["group"], new["spec"]["names"]["plural"])
            known = {t.version for t in types_from_crd(new)}
            for stale in [t for t in self._versions.get(key, []) if t.version not in known]:
                self._types.pop((stale.group, stale.version, stale.plural), None)
            self._versions[key] = [t for t in self._versions.get(key, []) if t.version in known]

    def _op_update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None,
        query: Mapping[str, str],
        user: UserInfo = EMULATOR_ADMIN,
    ) -> Reply:
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body of the request was in an unknown format")
        old = self._live[rtype.key].get((namespace, name))
        if old is None:
            raise ApiError.not_found(rtype.group, rtype.plural, name)
        new = kube_patch.clone(body)
        if not isinstance(new.get("metadata"), dict):
            new["metadata"] = {}
        body_name = new["metadata"].get("name")
        if body_name is not None and body_name != name:
            raise ApiError.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        new["metadata"]["name"] = name
        return self._commit_update(rtype, (namespace, name), old, new, subresource, query, user)

    def _op_patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        patch_type: str,
        subresource: str | None,
        query: Mapping[str, str],
        user: UserInfo = EMULATOR_ADMIN,
    ) -> Reply:
        old = self._live[rtype.key].get((namespace, name))
        if old is None:
            raise ApiError.not_found(rtype.group, rtype.plural, name)
        current = self._present(rtype, old)
        if patch_type == _JSON_PATCH:
            try:
                ops = kube_patch.decode_json_patch(patch)
            except kube_patch.PatchDecodeError as exc:
                raise ApiError.bad_request(str(exc)) from None
            try:
                new = kube_patch.json_patch(kube_patch.clone(current), ops)
            except kube_patch.PatchApplyError as exc:
                logger.debug("kube emulator: JSON patch of %s/%s failed: %s", rtype.plural, name, exc)
                raise ApiError(
                    422, "Invalid", "the server rejected our request due to an error in our request"
                ) from None
        else:
            if not isinstance(patch, dict):
                raise ApiError.bad_request(
                    "json: cannot unmarshal into Go value of type map[string]interface {}"
                )
            new = kube_patch.merge_patch(kube_patch.clone(current), patch)
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request")
        if not isinstance(new.get("metadata"), dict):
            new["metadata"] = {}
        if new["metadata"].get("name", name) != name:
            raise ApiError.bad_request(
                f"the name of the object ({new['metadata']['name']}) "
                f"does not match the name on the URL ({name})"
            )
        new["metadata"]["name"] = name
        return self._commit_update(rtype, (namespace, name), old, new, subresource, query, user)

    def _commit_update(
        self,
        rtype: ResourceType,
        okey: ObjKey,
        old: dict[str, Any],
        new: dict[str, Any],
        subresource: str | None,
        query: Mapping[str, str],
        user: UserInfo = EMULATOR_ADMIN,
    ) -> Reply:
        name = okey[1]
        self._check_kind(rtype, new)
        meta = new["metadata"]
        old_meta = old["metadata"]
        precondition = meta.get("resourceVersion")
        if precondition and precondition != old_meta.get("resourceVersion"):
            raise ApiError.conflict(rtype.group, rtype.plural, name)
        if rtype.namespaced:
            if meta.get("namespace", okey[0]) != okey[0]:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = okey[0]
        else:
            meta.pop("namespace", None)
        for key in _SYSTEM_META:
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        if subresource == "status":
            status = new.get("status", kube_schema._MISSING)
            new = {**kube_patch.clone(old), "apiVersion": new["apiVersion"]}
            meta = new["metadata"]
            if status is kube_schema._MISSING:
                new.pop("status", None)
            else:
                new["status"] = status
        elif rtype.status_subresource:
            if "status" in old:
                new["status"] = kube_patch.clone(old["status"])
            else:
                new.pop("status", None)
        old_view = self._present(rtype, old)
        warnings = self._admit(rtype, new, old_view, query, subresource=subresource)
        if old_meta.get("deletionTimestamp"):
            added = [
                f
                for f in new["metadata"].get("finalizers") or []
                if f not in (old_meta.get("finalizers") or [])
            ]
            if added:
                error = FieldError(
                    "FieldValueForbidden",
                    "metadata.finalizers",
                    detail="no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers {json.dumps(added)}",
                )
                raise self._invalid(rtype, name, [error])
        warnings += self._validating_admission("UPDATE", rtype, new, old_view, subresource, user, query)
        if rtype.key == ("", "namespaces") and subresource != "finalize":
            new.setdefault("spec", {})["finalizers"] = (old.get("spec") or {}).get("finalizers", [])
        if rtype.key == ("", "namespaces"):
            _label_namespace(new)
        if rtype.generation and "generation" in old_meta:
            ignored = ("metadata", "status") if rtype.status_subresource else ("metadata",)
            if _without(new, *ignored) != _without(old_view, *ignored):
                meta["generation"] = old_meta["generation"] + 1
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if new == old_view:
            return Reply(200, old_view, warnings=warnings)  # a no-op: no new version, no event
        if _dry_run(query):
            return Reply(200, self._present(rtype, new), warnings=warnings)
        stored = self._store(rtype, okey, old, new)
        self._after_write(rtype, old, stored)
        removed = self._finalize_if_released(self._storage_type(rtype.key), okey, stored)
        return Reply(200, self._present(rtype, removed if removed is not None else stored), warnings=warnings)

    def _op_delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        options: Mapping[str, Any],
        query: Mapping[str, str],
    ) -> Reply:
        old = self._live[rtype.key].get((namespace, name))
        if old is None:
            raise ApiError.not_found(rtype.group, rtype.plural, name)
        preconditions = options.get("preconditions") or {}
        old_meta = old["metadata"]
        if preconditions.get("uid") and preconditions["uid"] != old_meta.get("uid"):
            why = (
                f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                f"UID in object meta: {old_meta.get('uid')}"
            )
            raise ApiError.conflict(rtype.group, rtype.plural, name, why)
        if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != old_meta.get(
            "resourceVersion"
        ):
            why = (
                f"Precondition failed: ResourceVersion in precondition: {preconditions['resourceVersion']}, "
                f"ResourceVersion in object meta: {old_meta.get('resourceVersion')}"
            )
            raise ApiError.conflict(rtype.group, rtype.plural, name, why)
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
        if options.get("orphanDependents") is True:
            propagation = "Orphan"
        if _dry_run(query) or "All" in (options.get("dryRun") or []):
            return Reply(200, self._present(rtype, old))
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        result = self._delete_stored(
            self._storage_type(rtype.key),
            (namespace, name),
            old,
            propagation=propagation,
            grace_seconds=None if grace is None else int(grace),
        )
        current = self._live[rtype.key].get((namespace, name))
        if current is not None:  # deletion is pending on finalizers
            return Reply(200, self._present(rtype, current))
        if rtype.returns_deleted:
            return Reply(200, self._present(rtype, result))
        details = {"name": name, "group": rtype.group, "kind": rtype.plural, "uid": old_meta.get("uid")}
        return Reply(
            200,
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details},
        )

    def _delete_stored(
        self,
        rtype: ResourceType,
        okey: ObjKey,
        old: dict[str, Any],
        *,
        propagation: str,
        grace_seconds: int | None = None,
    ) -> dict[str, Any]:
        """Delete now, or mark for deletion when finalizers (or controllers, or a kubelet) must act first."""
        meta = old["metadata"]
        grace = _kubelet_grace(rtype, old, grace_seconds)
        if meta.get("deletionTimestamp"):
            waiting_for_kubelet = rtype.key == ("", "pods") and meta.get("deletionGracePeriodSeconds")
            if waiting_for_kubelet and grace == 0 and not meta.get("finalizers"):
                return self._drop(rtype, okey, old, orphan=propagation == "Orphan")  # grace 0 skips it
            return old  # already being deleted: nothing changes
        if grace:
            # A pod bound to a node stays until its kubelet has stopped it: with none, until a
            # DELETE with gracePeriodSeconds=0 (as on a real server without kubelets).
            new = kube_patch.clone(old)
            deadline = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=grace)
            new["metadata"]["deletionTimestamp"] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            if new["metadata"].get("generation", 0) > 0:
                new["metadata"]["generation"] += 1
            return self._store(rtype, okey, old, new)
        is_namespace = rtype.key == ("", "namespaces")
        if not meta.get("finalizers") and not is_namespace:
            return self._drop(rtype, okey, old, orphan=propagation == "Orphan")
        new = kube_patch.clone(old)
        new["metadata"]["deletionTimestamp"] = _now()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        if new["metadata"].get("generation", 0) > 0:
            new["metadata"]["generation"] += 1
        if propagation == "Orphan":
            self._orphaning.add(meta.get("uid", ""))
        if is_namespace:
            new["status"] = {"phase": "Terminating"}
        elif rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            conditions = [
                c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "Terminating"
            ]
            conditions.append(
                {
                    "type": "Terminating",
                    "status": "True",
                    "lastTransitionTime": _now(),
                    "reason": "InstanceDeletionInProgress",
                    "message": "CustomResource deletion is in progress",
                }
            )
            new.setdefault("status", {})["conditions"] = conditions
        stored = self._store(rtype, okey, old, new)
        if is_namespace:
            self._later(self._sweep_namespace, okey[1])
        elif rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._later(self._sweep_crd, okey[1])
        return stored

    def _op_delete_collection(
        self, rtype: ResourceType, namespace: str | None, options: Mapping[str, Any], query: Mapping[str, str]
    ) -> Reply:
        selected = self._selected(rtype, namespace, query)
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
        items = []
        for okey, obj in selected:
            if not _dry_run(query):
                obj = self._delete_stored(self._storage_type(rtype.key), okey, obj, propagation=propagation)
            items.append(self._present(rtype, obj))
        meta = {"resourceVersion": str(self._rv)}
        return Reply(
            200, {"kind": rtype.list_kind, "apiVersion": rtype.api_version, "metadata": meta, "items": items}
        )


def _kubelet_grace(rtype: ResourceType, obj: Mapping[str, Any], requested: int | None) -> int:
    """Seconds a pod's kubelet gets to stop it on deletion (the pod strategy's CheckGracefulDelete):
    none for other objects, pods no node runs and finished pods."""
    if rtype.key != ("", "pods"):
        return 0
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return 0
    if requested is not None:
        return max(requested, 0)
    return int(spec.get("terminationGracePeriodSeconds", 30))


def _name_problems(name: str, *, label: bool) -> list[str]:
    """apimachinery's IsDNS1123Label (namespaces) or IsDNS1123Subdomain (the rest), with its messages."""
    problems: list[str] = []
    limit = 63 if label else 253
    if len(name) > limit:
        problems.append(f"must be no more than {limit} characters")
    if label and not _LABEL_NAME_RE.match(name):
        problems.append(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
            "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        )
    elif not label and not _NAME_RE.match(name):
        problems.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return problems


def _event_problems(event: Mapping[str, Any]) -> list[FieldError]:
    """A core/v1 Event must be about an object of its own namespace (measured on kube-apiserver v1.36).

    An involvedObject without a namespace is accepted only for events in ``default`` (old clients).
    """
    involved = event.get("involvedObject")
    involved_namespace = (involved.get("namespace") or "") if isinstance(involved, Mapping) else ""
    namespace = _meta(event).get("namespace") or ""
    if involved_namespace == namespace or (not involved_namespace and namespace == "default"):
        return []
    return [
        FieldError(
            "FieldValueInvalid",
            "involvedObject.namespace",
            involved_namespace,
            "does not match event.namespace",
        )
    ]


def _label_namespace(obj: dict[str, Any]) -> None:
    meta = obj.setdefault("metadata", {})
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    meta["labels"] = {**labels, _NAMESPACE_NAME_LABEL: meta.get("name", "")}


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, val in headers.items():
        if key.lower() == lowered:
            return val
    return None


def _sort_key(item: tuple[ObjKey, Any]) -> tuple[str, str]:
    return (item[0][0] or "", item[0][1])


def _include(query: Mapping[str, str]) -> str:
    return query.get("includeObject") or "Metadata"


def _dry_run(query: Mapping[str, str]) -> bool:
    return query.get("dryRun") == "All"


def _unsupported_media(rtype: ResourceType, patch_type: str) -> ApiError:
    accepted = [_JSON_PATCH, _MERGE] + ([_STRATEGIC] if rtype.strategic_merge else [])
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
    )


def _api_group(group: str, versions: Sequence[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def _crd_status(crd: Mapping[str, Any]) -> dict[str, Any]:
    now = _now()
    names = dict(crd["spec"]["names"])
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", f"{names['kind']}List")
    storage = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
    return {
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": now,
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "acceptedNames": names,
        "storedVersions": storage,
    }


# --------------------------------------------------------------------------------------------------------
# Runner


def write_kubeconfig(path: pathlib.Path, url: str, *, token: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig whose current context points at ``url`` with a static bearer token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kube-emulator", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "kube-emulator", "user": {"token": token}}],
        "contexts": [
            {
                "name": "kube-emulator",
                "context": {"cluster": "kube-emulator", "user": "kube-emulator", "namespace": namespace},
            }
        ],
        "current-context": "kube-emulator",
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@dataclass
class KubeAPI:
    """A running emulator: its URL, a kubeconfig pointing at it and the emulator itself."""

    url: str
    kubeconfig_path: pathlib.Path
    emulator: KubeEmulator
    token: str

    #: Called with every emulator :meth:`running` served, when its block exits (session-wide checks of
    #: test suites, e.g. over ``emulator.request_log``).
    stopped_hooks: ClassVar[list[Callable[[KubeAPI], None]]] = []

    def kubeconfig_for(self, token: str) -> pathlib.Path:
        """A second kubeconfig next to the first, with another bearer token (another identity)."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", token)
        path = self.kubeconfig_path.with_name(f"kubeconfig-{safe}.yaml")
        return write_kubeconfig(path, self.url, token=token)

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls,
        *,
        crd_paths: Iterable[str | pathlib.Path] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        kubeconfig_path: str | pathlib.Path | None = None,
        token: str = "kube-emulator-token",
        emulator: KubeEmulator | None = None,
        strict: bool = True,
        rbac: Mapping[str, Authorizer] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        identities: Mapping[str, UserInfo] | None = None,
    ) -> AsyncIterator[KubeAPI]:
        """Serve on ``host:port`` (0: any free port) until the block exits; over TLS with ``ssl_context``.

        With ``strict`` (the default), an unexpected exception inside the emulator (a bug, not an API
        error answer) is re-raised when the block exits, so tests cannot pass over it.

        ``rbac`` maps bearer tokens to authorizers: requests with such a token are authorized and
        refused with 403 as a real server would (:mod:`agentrun.sandbox.kube_authz`); give that
        identity a kubeconfig with :meth:`kubeconfig_for`. The default token stays unrestricted.

        ``identities`` maps bearer tokens to the users they authenticate as (``request.userInfo`` of
        admission policies, SelfSubjectReview); every other token acts as ``kube-emulator``, the admin.
        """
        emulator = emulator if emulator is not None else KubeEmulator(strict=strict)
        emulator.authorizers.update(rbac or {})
        emulator.identities.update(identities or {})
        for crd_path in crd_paths:
            emulator.load_crd(crd_path)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(emulator)
            server = aiohttp.web.Server(emulator, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            stack.callback(emulator.close)
            site = aiohttp.web.TCPSite(runner, host, port, ssl_context=ssl_context)
            await site.start()
            bound_host, bound_port = runner.addresses[0][:2]
            url = f"{'https' if ssl_context else 'http'}://{bound_host}:{bound_port}"
            emulator._server_address = f"{bound_host}:{bound_port}"
            if kubeconfig_path is None:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="kube-emulator-"))
                kubeconfig_path = pathlib.Path(tmp) / "kubeconfig.yaml"
            config = write_kubeconfig(pathlib.Path(kubeconfig_path), url, token=token)
            logger.info("kube emulator: serving on %s", url)
            kube = cls(url=url, kubeconfig_path=config, emulator=emulator, token=token)
            try:
                yield kube
            finally:
                for hook in cls.stopped_hooks:
                    hook(kube)


async def _serve_until_signalled(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    emulator = KubeEmulator(strict=False, require_namespaces=not args.auto_namespaces)
    kubeconfig = args.kubeconfig or pathlib.Path(tempfile.gettempdir()) / "kube-emulator.yaml"
    async with KubeAPI.running(
        crd_paths=args.crd,
        host=args.host,
        port=args.port,
        kubeconfig_path=kubeconfig,
        token=args.token,
        emulator=emulator,
    ) as kube:
        print(f"READY {kube.url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun.sandbox.kube_api", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--kubeconfig", type=pathlib.Path, help="where to write a kubeconfig for the emulator"
    )
    parser.add_argument("--crd", action="append", default=[], help="a CRD YAML file to load (repeatable)")
    parser.add_argument("--token", default="kube-emulator-token", help="bearer token put into the kubeconfig")
    parser.add_argument("--auto-namespaces", action="store_true", help="do not require namespaces to exist")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(_serve_until_signalled(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
