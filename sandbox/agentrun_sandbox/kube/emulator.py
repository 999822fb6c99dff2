"""A Kubernetes API emulator for tests, benchmarks and the offline demo: kmock plus a fidelity layer.

kmock's :class:`~kmock.KubernetesEmulator` gives the HTTP handler, request parsing, the ``objects`` view
(every version of every object, for assertions) and a DSL for ad-hoc reactions. Its write semantics are
too naive for a real operator (see design.md, "Kopf against a real API server"), so
:class:`KubeEmulator` serves every Kubernetes request itself, the way kube-apiserver does. Its layers,
each a class in its own module, bottom up: storage, lifecycle (deletion and the control-plane
controllers), admission, verbs, watch, access (authorization), discovery, routing (the HTTP handler):


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
  against the version's ``openAPIV3Schema`` (:mod:`agentrun_sandbox.kube.schema`), with the server's
  422 messages and ``Warning`` headers for pruned fields (``?fieldValidation=Strict`` turns them into 400);
* ``x-kubernetes-validations``: a safe CEL subset (:mod:`agentrun_sandbox.kube.cel`) covering
  immutability and transition rules; rules outside it are ignored with one log line each;
* ``labelSelector`` / ``fieldSelector`` on list, watch and deletecollection; ``limit``/``continue``
  paging on lists; ``?watch=true`` with ``resourceVersion`` resumption from a bounded history
  (410 Expired beyond it), ``sendInitialEvents`` with the closing bookmark, ``timeoutSeconds``;
* built-in types: v1 namespaces (``default`` and the ``kube-*`` ones exist), configmaps, secrets,
  serviceaccounts, events, pods (with ``pods/log`` serving :attr:`KubeEmulator.pod_logs` as the kubelet),
  events.k8s.io/v1 events, coordination.k8s.io/v1 leases, apiextensions.k8s.io/v1 CRDs; discovery on
  ``/api`` and ``/apis`` with scopes, verbs, kinds, short names and categories;
* server-side Tables (printer columns), so ``kubectl get`` works;
* optional authorization per bearer token (``EmulatedCluster.running(rbac={token: authorizer})``, see
  :mod:`agentrun_sandbox.kube.authz`): 403 Forbidden with the server's wording, impersonation checks
  (legacy and constrained) and the owner-reference admission check; other tokens are unrestricted;
* rbac.authorization.k8s.io/v1 Roles, ClusterRoles and bindings; with
  :attr:`KubeEmulator.authorize_impersonated_users` they authorize impersonated requests as their
  target (:mod:`agentrun_sandbox.kube.rbac`);
* identities: a token registered in :attr:`KubeEmulator.identities`
  (``EmulatedCluster.running(identities=...)``) is that user, an authorizer's token its user, any
  other token ``kube-emulator`` (system:masters);
  ``Impersonate-User`` replaces it. ``kubectl auth whoami`` (SelfSubjectReview) answers with it;
* ValidatingAdmissionPolicy/Binding (admissionregistration.k8s.io/v1,
  :mod:`agentrun_sandbox.kube.admission_policies`) on creates and updates after schema validation,
  seeing ``request.userInfo``; namespaces carry the
  ``kubernetes.io/metadata.name`` label their selectors match on;
* fault injection (:attr:`KubeEmulator.faults`, see :mod:`agentrun_sandbox.kube.faults`) applied before
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

       async with EmulatedCluster.running(crd_paths=["crds/agentruns.agentrun.dev.yaml"]) as kube:
           kube.url              # http://127.0.0.1:PORT
           kube.kubeconfig_path  # a kubeconfig for Kopf, kubectl, kubernetes_asyncio
           kube.emulator         # objects, request_log, faults, pod_logs, load_crd(), ...

2. As a child process (the operator under test runs in its own process anyway)::

       python -m agentrun_sandbox.kube.server --port 0 --kubeconfig /tmp/kube.yaml --crd crds/x.yaml

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

import pathlib
from collections.abc import Mapping
from typing import Any

import attrs
import yaml

from agentrun_sandbox.kube import patch as kube_patch
from agentrun_sandbox.kube.basics import JSON_PATCH, MERGE_PATCH, metadata_of
from agentrun_sandbox.kube.registry import BUILTIN_NAMESPACES, BUILTIN_TYPES, ResourceType
from agentrun_sandbox.kube.routing import EmulatorRouting

__all__ = ["KubeEmulator"]


@attrs.define(kw_only=True)
class KubeEmulator(EmulatorRouting):
    """The emulated API server as an aiohttp-compatible handler (see the module docstring).

    Object dicts held by the emulator are never mutated after they are stored (every write stores a new
    dict), so reading ``emulator.objects`` or :meth:`get_object` results is safe but they must not be
    modified: write through the API or the ``*_object`` helpers instead.
    """

    def __attrs_post_init__(self) -> None:
        # Deliberately not calling super(): kmock's fallbacks would serve its naive store. Every Kubernetes
        # request is served by EmulatorRouting._handle(); kmock's DSL remains available for user-defined
        # reactions.
        for rtype in BUILTIN_TYPES:
            self.add_resource(rtype)
        for namespace in BUILTIN_NAMESPACES:
            self.create_object("namespaces", {"metadata": {"name": namespace}})

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
            name = metadata_of(doc).get("name", "")
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
        namespace = (namespace or metadata_of(body).get("namespace")) if rtype.namespaced else None
        reply = self._op_create(rtype, namespace, dict(body), {})
        return dict(kube_patch.clone(reply.body))

    def patch_object(
        self, resource: str, namespace: str | None, name: str, patch: Any, *, subresource: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch (a dict) or JSON-patch (a list) an object, e.g. to play a controller in a test."""
        rtype = self.resolve(resource)
        content_type = MERGE_PATCH if isinstance(patch, Mapping) else JSON_PATCH
        reply = self._op_patch(rtype, namespace, name, patch, content_type, subresource, {})
        return dict(kube_patch.clone(reply.body))

    def delete_object(self, resource: str, namespace: str | None, name: str) -> None:
        rtype = self.resolve(resource)
        self._op_delete(rtype, namespace, name, {}, {})

    def set_pod_log(self, namespace: str, name: str, text: str) -> None:
        self.pod_logs[(namespace, name)] = text
