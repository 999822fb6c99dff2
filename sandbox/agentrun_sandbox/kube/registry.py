"""What the emulated API server serves: built-in resource types and the types CRDs declare.

Kopf and ``kubernetes_asyncio`` discover resources through ``/api`` and ``/apis``, so every type carries
what discovery needs (kind, scope, verbs, short names, categories, subresources) plus what the write path
needs (the version's schema, whether ``status`` is a subresource, whether ``generation`` is kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun_sandbox.kube.schema import FieldError

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = {
    "status": ("get", "patch", "update"),
    "log": ("get",),
    "finalize": ("update",),
    "exec": ("create", "get"),
}
#: Subresources whose discovery kind is not the resource's own.
SUBRESOURCE_KINDS = {"exec": "PodExecOptions"}
CRD_CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"


@dataclass(frozen=True, eq=False)
class ResourceType:
    """One group/version/plural as served; ``key`` identifies the storage shared by all its versions.

    Compared by identity: the schema inside is a plain (unhashable) dict.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: tuple[str, ...] = ALL_VERBS
    schema: Mapping[str, Any] | None = None
    custom: bool = False
    generation: bool = False
    returns_deleted: bool = True
    printer_columns: tuple[Mapping[str, Any], ...] = ()
    selectable_fields: tuple[str, ...] = ()
    served: bool = True
    storage: bool = True
    strategic_merge: bool = False
    #: Its REST strategy's AllowCreateOnUpdate (a PUT of a missing object without resourceVersion creates it)
    #: and not AllowUnconditionalUpdate (a PUT must carry resourceVersion), as kube-apiserver has for Leases.
    create_on_update: bool = False
    update_needs_version: bool = False
    preferred_order: int = field(default=0, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def status_subresource(self) -> bool:
        return "status" in self.subresources

    @property
    def qualified_kind(self) -> str:
        """``Kind.group`` as in the server's error messages (``AgentRun.agentrun.dev``, ``ConfigMap``)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def qualified_resource(self) -> str:
        """``plural.group`` as in ``agentruns.agentrun.dev "x" not found``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery(self) -> list[dict[str, Any]]:
        """APIResource entries for ``/apis/group/version``, the resource followed by its subresources."""
        entries = [
            {
                "name": self.plural,
                "singularName": self.singular or self.kind.lower(),
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": list(self.verbs),
                **({"shortNames": list(self.short_names)} if self.short_names else {}),
                **({"categories": list(self.categories)} if self.categories else {}),
                "storageVersionHash": "",
            }
        ]
        for sub in sorted(self.subresources):
            entries.append(
                {
                    "name": f"{self.plural}/{sub}",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": SUBRESOURCE_KINDS.get(sub, self.kind),
                    "verbs": list(SUBRESOURCE_VERBS.get(sub, ("get",))),
                }
            )
        return entries


def _core(plural: str, kind: str, *, namespaced: bool = True, **kwargs: Any) -> ResourceType:
    return ResourceType(
        group="",
        version="v1",
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        strategic_merge=True,
        **kwargs,
    )


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _core(
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=frozenset({"status", "finalize"}),
    ),
    _core("configmaps", "ConfigMap", short_names=("cm",), returns_deleted=False),
    _core("secrets", "Secret", returns_deleted=False),
    _core("serviceaccounts", "ServiceAccount", short_names=("sa",), returns_deleted=False),
    _core("events", "Event", short_names=("ev",), returns_deleted=False),
    _core(
        "pods",
        "Pod",
        short_names=("po",),
        categories=("all",),
        generation=True,
        subresources=frozenset({"status", "log", "exec"}),
    ),
    ResourceType(
        group="events.k8s.io",
        version="v1",
        plural="events",
        kind="Event",
        namespaced=True,
        short_names=("ev",),
        returns_deleted=False,
    ),
    ResourceType(
        group="networking.k8s.io",
        version="v1",
        plural="networkpolicies",
        kind="NetworkPolicy",
        namespaced=True,
        short_names=("netpol",),
        returns_deleted=False,
        strategic_merge=True,
        generation=True,
    ),
    ResourceType(
        group="coordination.k8s.io",
        version="v1",
        plural="leases",
        kind="Lease",
        namespaced=True,
        returns_deleted=False,
        strategic_merge=True,
        create_on_update=True,
        update_needs_version=True,
    ),
    *(
        ResourceType(
            group="rbac.authorization.k8s.io",
            version="v1",
            plural=plural,
            kind=kind,
            namespaced=namespaced,
            returns_deleted=False,
            strategic_merge=True,
        )
        for plural, kind, namespaced in (
            ("roles", "Role", True),
            ("rolebindings", "RoleBinding", True),
            ("clusterroles", "ClusterRole", False),
            ("clusterrolebindings", "ClusterRoleBinding", False),
        )
    ),
    ResourceType(
        group="apiextensions.k8s.io",
        version="v1",
        plural="customresourcedefinitions",
        kind="CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        categories=("api-extensions",),
        subresources=frozenset({"status"}),
        generation=True,
    ),
    ResourceType(
        group="admissionregistration.k8s.io",
        version="v1",
        plural="validatingadmissionpolicies",
        kind="ValidatingAdmissionPolicy",
        namespaced=False,
        subresources=frozenset({"status"}),
        generation=True,
        categories=("api-extensions",),
    ),
    ResourceType(
        group="admissionregistration.k8s.io",
        version="v1",
        plural="validatingadmissionpolicybindings",
        kind="ValidatingAdmissionPolicyBinding",
        namespaced=False,
        generation=True,
        categories=("api-extensions",),
    ),
    # Answered from the request's authorizer, never stored (kubectl auth can-i).
    ResourceType(
        group="authorization.k8s.io",
        version="v1",
        plural="selfsubjectaccessreviews",
        kind="SelfSubjectAccessReview",
        namespaced=False,
        verbs=("create",),
    ),
    # Answered from the request's identity, never stored (kubectl auth whoami).
    ResourceType(
        group="authentication.k8s.io",
        version="v1",
        plural="selfsubjectreviews",
        kind="SelfSubjectReview",
        namespaced=False,
        verbs=("create",),
    ),
)

BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def _path(json_path: str) -> str:
    return json_path.lstrip(".")


def types_from_crd(crd: Mapping[str, Any]) -> list[ResourceType]:
    """All served versions of a CRD; the first one is the storage version."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    types: list[ResourceType] = []
    for order, version in enumerate(spec.get("versions") or []):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        subresources = frozenset((version.get("subresources") or {}).keys())
        types.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or names["kind"].lower(),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=subresources,
                schema=schema,
                custom=True,
                generation=True,
                printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
                selectable_fields=tuple(_path(f["jsonPath"]) for f in version.get("selectableFields") or ()),
                served=bool(version.get("served", True)),
                storage=bool(version.get("storage", False)),
                preferred_order=order,
            )
        )
    types.sort(key=lambda t: (not t.storage, t.preferred_order))
    return [t for t in types if t.served] or types[:1]


def crd_problems(crd: Mapping[str, Any]) -> list[FieldError]:
    """The structural checks the server makes on a CRD before accepting it (a useful subset)."""
    errors: list[FieldError] = []
    spec = crd.get("spec")
    if not isinstance(spec, Mapping):
        return [FieldError("FieldValueRequired", "spec")]
    raw_names = spec.get("names")
    names: Mapping[str, Any] = raw_names if isinstance(raw_names, Mapping) else {}
    group = spec.get("group")
    if not isinstance(group, str) or "." not in group:
        errors.append(
            FieldError(
                "FieldValueInvalid", "spec.group", group or "", "should be a domain with at least one dot"
            )
        )
    for key in ("plural", "kind"):
        if not isinstance(names.get(key), str) or not names.get(key):
            errors.append(FieldError("FieldValueRequired", f"spec.names.{key}"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errors.append(
            FieldError(
                "FieldValueNotSupported",
                "spec.scope",
                spec.get("scope") or "",
                'supported values: "Cluster", "Namespaced"',
            )
        )
    versions = spec.get("versions")
    if not isinstance(versions, list) or not versions:
        errors.append(
            FieldError(
                "FieldValueInvalid",
                "spec.versions",
                versions or [],
                "must have exactly one version marked as storage version",
            )
        )
        return errors
    if sum(1 for v in versions if isinstance(v, Mapping) and v.get("storage")) != 1:
        errors.append(
            FieldError(
                "FieldValueInvalid",
                "spec.versions",
                versions,
                "must have exactly one version marked as storage version",
            )
        )
    for index, version in enumerate(versions):
        if not isinstance(version, Mapping) or not version.get("name"):
            errors.append(FieldError("FieldValueRequired", f"spec.versions[{index}].name"))
            continue
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not schema:
            errors.append(
                FieldError(
                    "FieldValueRequired",
                    f"spec.versions[{index}].schema.openAPIV3Schema",
                    detail="schemas are required",
                )
            )
            continue
        errors += _root_metadata_problems(schema, _schema_path(versions, index))
    expected = f"{names.get('plural')}.{group}"
    name = (crd.get("metadata") or {}).get("name")
    if not errors and name != expected:
        errors.append(
            FieldError(
                "FieldValueInvalid", "metadata.name", name or "", 'must be spec.names.plural+"."+spec.group'
            )
        )
    return errors


_METADATA_SETTABLE = frozenset({"name", "generateName"})


def _schema_path(versions: list[Any], index: int) -> str:
    """Where kube-apiserver reports a schema problem: versions that all share one schema are validated
    as the internal top-level `spec.validation`, so its errors name that path.
    """
    schemas = [((v.get("schema") or {}).get("openAPIV3Schema")) for v in versions if isinstance(v, Mapping)]
    if all(schema == schemas[0] for schema in schemas):
        return "spec.validation.openAPIV3Schema"
    return f"spec.versions[{index}].schema.openAPIV3Schema"


def _root_metadata_problems(schema: Mapping[str, Any], path: str) -> list[FieldError]:
    """kube-apiserver's structural rule for the root `metadata`: only `type: object`, and at most the
    `name`/`generateName` properties with string restrictions. A `description` there is refused too.
    """
    meta = (schema.get("properties") or {}).get("metadata")
    if not isinstance(meta, Mapping):
        return []
    extra = set(meta) - {"type", "properties"}
    props = meta.get("properties") or {}
    if extra or not isinstance(props, Mapping) or set(props) - _METADATA_SETTABLE:
        return [
            FieldError(
                "FieldValueForbidden",
                f"{path}.properties[metadata]",
                detail="must not specify anything other than name and generateName, "
                "but metadata is implicitly specified",
            )
        ]
    if meta.get("type", "object") != "object":
        return [
            FieldError(
                "FieldValueInvalid", f"{path}.properties[metadata].type", meta.get("type"), "must be object"
            )
        ]
    return []
