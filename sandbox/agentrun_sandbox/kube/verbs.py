"""The verbs on stored objects: list, create, update, patch, delete, deletecollection, pods/log and exec."""

from __future__ import annotations

import base64
import json
import logging
import random
import uuid
from collections.abc import Mapping
from typing import Any

import attrs

from agentrun_sandbox.kube import patch as kube_patch
from agentrun_sandbox.kube import schema as kube_schema
from agentrun_sandbox.kube import tables
from agentrun_sandbox.kube.admission import EmulatorAdmission, label_namespace
from agentrun_sandbox.kube.authz import EMULATOR_ADMIN, UserInfo
from agentrun_sandbox.kube.basics import JSON_PATCH, ObjKey, Reply, dry_run, include_object, now, without
from agentrun_sandbox.kube.http import ApiError
from agentrun_sandbox.kube.registry import ResourceType
from agentrun_sandbox.kube.schema import FieldError

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_META = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
)

logger = logging.getLogger("agentrun_sandbox.kube.emulator")


@attrs.define(kw_only=True)
class EmulatorVerbs(EmulatorAdmission):
    """Each verb as kube-apiserver answers it, on the stores below."""

    #: Text served by ``pods/log``, by ``(namespace, pod name)``: what a kubelet would answer.
    pod_logs: dict[tuple[str, str], str] = attrs.field(factory=dict)

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
                200, tables.as_table(rtype, items, str(self._rv), include_object=include_object(query))
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
        node = self._kubelet_target(namespace, name, query)
        if node and (namespace, name) not in self.pod_logs:
            raise _no_node(node)
        text = self.pod_logs.get((namespace, name), "")
        if tail := query.get("tailLines"):
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) > 0 else ""
        return Reply(200, text=text)

    def _serve_exec(self, namespace: str, name: str, query: Mapping[str, str]) -> Reply:
        """What kube-apiserver answers before it would reach a kubelet: the emulator runs no containers.

        The pod and container are checked as for logs; a pod not yet on a node is refused with 400, as a
        real server does (the upgrade is never accepted); a pod bound to a node reaches for that Node,
        which the emulator does not store, so the answer is a real server's for a missing Node.
        """
        node = self._kubelet_target(namespace, name, query)
        if not node:
            raise ApiError.bad_request(f"pod {name} does not have a host assigned")
        raise _no_node(node)

    def _kubelet_target(self, namespace: str, name: str, query: Mapping[str, str]) -> str | None:
        """The node of the pod a log or exec request is for, once its ``container`` parameter is valid."""
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
        return str(node) if node else None

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
        meta["creationTimestamp"] = now()
        if rtype.generation:
            meta["generation"] = 1
        if dry_run(query):
            meta["resourceVersion"] = ""
            return Reply(201, self._present(rtype, obj), warnings=warnings)
        stored = self._store(rtype, (namespace, name), None, obj)
        self._after_write(rtype, None, stored)
        return Reply(201, self._present(rtype, stored), warnings=warnings)

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
        creates = old is None and rtype.create_on_update and subresource is None
        if old is None and not creates:
            raise ApiError.not_found(rtype.group, rtype.plural, name)
        body_meta = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
        body_uid, stored_uid = body_meta.get("uid"), "" if old is None else old["metadata"].get("uid", "")
        if body_uid and body_uid != stored_uid:
            # The uid in the body is a precondition (kube-apiserver v1.36): the object it was read as is gone.
            raise ApiError.conflict(
                rtype.group,
                rtype.plural,
                name,
                "StorageError: invalid object, Code: 4, AdditionalErrorMsg: Precondition failed: "
                f"UID in precondition: {body_uid}, UID in object meta: {stored_uid}",
            )
        if creates:
            # A Lease PUT to a missing name creates it (its strategy's AllowCreateOnUpdate).
            created = kube_patch.clone(body)
            created.setdefault("metadata", {}).pop("resourceVersion", None)
            return self._op_create(rtype, namespace, created, query, user)
        if rtype.update_needs_version and not body_meta.get("resourceVersion"):
            error = FieldError(
                "FieldValueInvalid", "metadata.resourceVersion", 0, "must be specified for an update"
            )
            raise self._invalid(rtype, name, [error])
        assert old is not None  # a missing object was created or refused above
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
        if patch_type == JSON_PATCH:
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
            status = new.get("status", kube_schema.MISSING)
            new = {**kube_patch.clone(old), "apiVersion": new["apiVersion"]}
            meta = new["metadata"]
            if status is kube_schema.MISSING:
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
            label_namespace(new)
        if rtype.generation and "generation" in old_meta:
            ignored = ("metadata", "status") if rtype.status_subresource else ("metadata",)
            if without(new, *ignored) != without(old_view, *ignored):
                meta["generation"] = old_meta["generation"] + 1
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if new == old_view:
            return Reply(200, old_view, warnings=warnings)  # a no-op: no new version, no event
        if dry_run(query):
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
        if dry_run(query) or "All" in (options.get("dryRun") or []):
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

    def _op_delete_collection(
        self, rtype: ResourceType, namespace: str | None, options: Mapping[str, Any], query: Mapping[str, str]
    ) -> Reply:
        selected = self._selected(rtype, namespace, query)
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
        items = []
        for okey, obj in selected:
            if not dry_run(query):
                obj = self._delete_stored(self._storage_type(rtype.key), okey, obj, propagation=propagation)
            items.append(self._present(rtype, obj))
        meta = {"resourceVersion": str(self._rv)}
        return Reply(
            200, {"kind": rtype.list_kind, "apiVersion": rtype.api_version, "metadata": meta, "items": items}
        )


def _no_node(node: str) -> ApiError:
    """A real server's answer when the pod's Node is not stored: it looks the Node up as a pod."""
    return ApiError(404, "NotFound", f'pods "{node}" not found', {"name": node, "kind": "pods"})
