"""How objects end: deletion, finalizers, and the controllers a real control plane runs for them.

The garbage collector (ownerReferences), the namespace and CRD finalizers and a kubelet's grace period for
bound pods act after the request that set them off (:meth:`EmulatorStorage._later`), as the real
controllers act asynchronously.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import attrs

from agentrun_sandbox.kube import patch as kube_patch
from agentrun_sandbox.kube.basics import ObjKey, metadata_of, now, owner_uids, sort_key
from agentrun_sandbox.kube.registry import CRD_CLEANUP_FINALIZER, ResourceType, types_from_crd
from agentrun_sandbox.kube.storage import EmulatorStorage


@attrs.define(kw_only=True)
class EmulatorLifecycle(EmulatorStorage):
    """Deletion and the control-plane controllers that follow it."""

    def _owner_missing(self, owner_uid: str) -> None:
        # The real garbage collector also removes dependents whose owner is already gone
        # (e.g. written by a controller that raced the owner's deletion).
        self._later(self._collect_garbage, owner_uid)

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
        uid = metadata_of(old).get("uid", "")
        if uid in self._dependents:
            if orphan or uid in self._orphaning:
                self._orphan(uid)
            else:
                self._later(self._collect_garbage, uid)
        self._orphaning.discard(uid)
        self._after_drop(rtype, okey, final)
        return final

    def _after_drop(self, rtype: ResourceType, okey: ObjKey, final: Mapping[str, Any]) -> None:
        namespace = okey[0]
        if namespace is not None and namespace not in self._ns_counts:
            self._later(self._finish_namespace, namespace)
        if rtype.custom:
            crd_name = f"{rtype.plural}.{rtype.group}"
            crd = self._live[("apiextensions.k8s.io", "customresourcedefinitions")].get((None, crd_name))
            if (
                crd is not None
                and metadata_of(crd).get("deletionTimestamp")
                and not self._live.get(rtype.key)
            ):
                self._later(self._finish_crd, crd_name)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            spec = final.get("spec") or {}
            self._remove_resource((spec.get("group", ""), (spec.get("names") or {}).get("plural", "")))

    def _finalize_if_released(
        self, rtype: ResourceType, okey: ObjKey, obj: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Remove an object whose deletion was pending once nothing holds it any more."""
        meta = metadata_of(obj)
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
            alive = {uid for uid in owner_uids(obj) if uid in self._uids}
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
            for okey, obj in sorted(objects.items(), key=sort_key):
                if okey[0] == namespace and not metadata_of(obj).get("deletionTimestamp"):
                    self._delete_stored(rtype, okey, obj, propagation="Background")
        self._finish_namespace(namespace)

    def _finish_namespace(self, namespace: str) -> None:
        namespaces = self._storage_type(("", "namespaces"))
        obj = self._live[namespaces.key].get((None, namespace))
        if obj is None or not metadata_of(obj).get("deletionTimestamp") or namespace in self._ns_counts:
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
            for okey, obj in sorted(self._live.get(key, {}).items(), key=sort_key):
                if not metadata_of(obj).get("deletionTimestamp"):
                    self._delete_stored(rtype, okey, obj, propagation="Background")
        self._finish_crd(crd_name)

    def _finish_crd(self, crd_name: str) -> None:
        crds = self._storage_type(("apiextensions.k8s.io", "customresourcedefinitions"))
        crd = self._live[crds.key].get((None, crd_name))
        if crd is None or not metadata_of(crd).get("deletionTimestamp"):
            return
        key = (crd["spec"]["group"], crd["spec"]["names"]["plural"])
        if self._live.get(key):
            return
        finalizers = metadata_of(crd).get("finalizers") or []
        if CRD_CLEANUP_FINALIZER in finalizers:
            new = kube_patch.clone(crd)
            new["metadata"]["finalizers"] = [f for f in finalizers if f != CRD_CLEANUP_FINALIZER]
            if not new["metadata"]["finalizers"]:
                del new["metadata"]["finalizers"]
            crd = self._store(crds, (None, crd_name), crd, new)
        self._finalize_if_released(crds, (None, crd_name), crd)

    def _after_write(
        self, rtype: ResourceType, old: Mapping[str, Any] | None, new: Mapping[str, Any]
    ) -> None:
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions") and not metadata_of(new).get(
            "deletionTimestamp"
        ):
            for served in types_from_crd(new):
                self.add_resource(served)
            key = (new["spec"]["group"], new["spec"]["names"]["plural"])
            known = {t.version for t in types_from_crd(new)}
            for stale in [t for t in self._versions.get(key, []) if t.version not in known]:
                self._types.pop((stale.group, stale.version, stale.plural), None)
            self._versions[key] = [t for t in self._versions.get(key, []) if t.version in known]

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
        new["metadata"]["deletionTimestamp"] = now()
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
                    "lastTransitionTime": now(),
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
