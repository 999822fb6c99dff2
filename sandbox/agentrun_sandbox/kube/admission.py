"""What a write must pass before it is stored: metadata rules, the schema and CEL, admission policies."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from agentrun_sandbox.kube import admission_policies, validation
from agentrun_sandbox.kube import schema as kube_schema
from agentrun_sandbox.kube.authz import UserInfo
from agentrun_sandbox.kube.basics import dry_run, metadata_of, now
from agentrun_sandbox.kube.http import ApiError
from agentrun_sandbox.kube.lifecycle import EmulatorLifecycle
from agentrun_sandbox.kube.registry import CRD_CLEANUP_FINALIZER, ResourceType, crd_problems
from agentrun_sandbox.kube.schema import FieldError
from agentrun_sandbox.kube.selectors import label_problems

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: The label kube-apiserver keeps on every namespace (namespaceSelectors match on it).
_NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@attrs.define(kw_only=True)
class EmulatorAdmission(EmulatorLifecycle):
    """Validation and admission of writes, in the order kube-apiserver applies them."""

    #: Refuse namespaced objects in namespaces that do not exist, as the real server does.
    require_namespaces: bool = True

    def _invalid(self, rtype: ResourceType, name: str, errors: list[FieldError]) -> ApiError:
        return ApiError.invalid(rtype.group, rtype.kind, name, errors)

    def _check_meta(self, rtype: ResourceType, obj: Mapping[str, Any], errors: list[FieldError]) -> None:
        meta = metadata_of(obj)
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
        if rtype.key == ("coordination.k8s.io", "leases"):
            _check_lease_times(rtype, obj)
        errors: list[FieldError] = []
        self._check_meta(rtype, obj, errors)
        if schema is not None:
            old_obj = kube_schema.MISSING if old is None else old
            body_root = "status" if subresource == "status" else ""
            errors += validation.validate(obj, schema, old_obj, prior=errors, body_root=body_root)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            errors += crd_problems(obj)
        elif rtype.key == admission_policies.POLICIES:
            admission_policies.default_policy(obj)
            errors += admission_policies.policy_problems(obj)
        elif rtype.key == admission_policies.BINDINGS:
            admission_policies.default_binding(obj)
            errors += admission_policies.binding_problems(obj)
        elif rtype.key == ("networking.k8s.io", "networkpolicies"):
            _omit_empty_rules(obj)
        elif rtype.key == ("", "events"):
            errors += _event_problems(obj)
        elif rtype.key == ("coordination.k8s.io", "leases"):
            errors += _lease_problems(obj)
        if errors:
            raise self._invalid(rtype, metadata_of(obj).get("name", ""), errors)
        return [f'unknown field "{p}"' for p in pruned]

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
        policies = list(self._live.get(admission_policies.POLICIES, {}).values())
        if not policies:
            return []
        meta = metadata_of(obj)
        namespace = meta.get("namespace") if rtype.namespaced else None
        request = admission_policies.AdmissionRequest(
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
            dry_run=dry_run(query),
        )
        bindings = self._live.get(admission_policies.BINDINGS, {}).values()
        verdict = admission_policies.evaluate(policies, bindings, request, self._policy_params)
        if verdict.denial is not None:
            raise verdict.denial
        return list(verdict.warnings)

    def _policy_params(self, api_version: str, kind: str) -> admission_policies.ParamSource | None:
        """The stored objects of a policy's paramKind, when that kind is served."""
        for rtype in self._types.values():
            if rtype.api_version == api_version and rtype.kind == kind and rtype.served:
                objects = list(self._live.get(rtype.key, {}).values())
                return admission_policies.ParamSource(rtype.namespaced, objects)
        return None

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
        if metadata_of(ns).get("deletionTimestamp"):
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
            label_namespace(obj)
        elif rtype.key == ("", "pods"):
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        elif rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            problems = crd_problems(obj)
            if problems:
                raise self._invalid(rtype, metadata_of(obj).get("name", ""), problems)
            spec = obj["spec"]
            crd_name = f"{spec['names']['plural']}.{spec['group']}"
            crd_key = (spec["group"], spec["names"]["plural"])
            if crd_key in self._versions and not any(t.custom for t in self._versions[crd_key]):
                raise ApiError.already_exists(rtype.group, rtype.plural, crd_name)
            meta = obj["metadata"]
            meta["finalizers"] = [*(meta.get("finalizers") or []), CRD_CLEANUP_FINALIZER]
            obj["status"] = _crd_status(obj)


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
    namespace = metadata_of(event).get("namespace") or ""
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


_MICRO_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
_MICRO_TIME_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"


def _check_lease_times(rtype: ResourceType, lease: Mapping[str, Any]) -> None:
    """A Lease's acquireTime and renewTime are MicroTimes: exactly six fraction digits, else the body does
    not decode (400, measured on kube-apiserver v1.36: "2026-11-24T10:00:00Z" is refused)."""
    spec = lease.get("spec")
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key) if isinstance(spec, Mapping) else None
        if value is not None and not (isinstance(value, str) and _MICRO_TIME_RE.match(value)):
            raise ApiError.bad_request(
                f'{rtype.kind} in version "{rtype.version}" cannot be handled as a {rtype.kind}: '
                f'parsing time "{value}" as "{_MICRO_TIME_LAYOUT}": cannot parse "{value}"'
            )


def _lease_problems(lease: Mapping[str, Any]) -> list[FieldError]:
    """ValidateLeaseSpec: a duration, when given, is positive (measured on kube-apiserver v1.36)."""
    spec = lease.get("spec")
    duration = spec.get("leaseDurationSeconds") if isinstance(spec, Mapping) else None
    if isinstance(duration, int) and duration <= 0:
        return [
            FieldError("FieldValueInvalid", "spec.leaseDurationSeconds", duration, "must be greater than 0")
        ]
    return []


def label_namespace(obj: dict[str, Any]) -> None:
    meta = obj.setdefault("metadata", {})
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    meta["labels"] = {**labels, _NAMESPACE_NAME_LABEL: meta.get("name", "")}


def _crd_status(crd: Mapping[str, Any]) -> dict[str, Any]:
    stamp = now()
    names = dict(crd["spec"]["names"])
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", f"{names['kind']}List")
    storage = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
    return {
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "lastTransitionTime": stamp,
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "lastTransitionTime": stamp,
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "acceptedNames": names,
        "storedVersions": storage,
    }


# --------------------------------------------------------------------------------------------------------
# Runner


def _omit_empty_rules(obj: dict[str, Any]) -> None:
    """A NetworkPolicy's empty ``ingress``/``egress`` lists are not stored: the Go types mark them
    ``omitempty``, so a real server answers a deny-all policy without the keys."""
    spec = obj.get("spec")
    if isinstance(spec, dict):
        for key in ("ingress", "egress"):
            if spec.get(key) == []:
                del spec[key]
