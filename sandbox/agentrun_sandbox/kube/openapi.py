"""A minimal OpenAPI v3 publication, enough for ``kubectl create/apply -f`` and ``kubectl explain``.

kubectl validates manifests by checking, in the server's OpenAPI v3 document, that the PATCH operation
of the object's kind accepts the ``fieldValidation`` query parameter; it then leaves validation to the
server (``?fieldValidation=Strict``). ``kubectl explain`` reads the kind's schema from
``components.schemas``. Custom resources publish their CRD schema (with ``metadata`` described as
ObjectMeta); built-in kinds publish a permissive object schema, since the emulator does not carry the
Kubernetes type definitions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun_sandbox.kube.registry import ResourceType

_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_META_SCHEMA = {
    "description": "Standard object's metadata.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "namespace": {"type": "string", "description": "The space within which each name must be unique."},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Labels."},
        "annotations": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Annotations.",
        },
        "generateName": {"type": "string", "description": "Prefix for a server-generated unique name."},
        "finalizers": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Finalizers of the object.",
        },
        "uid": {"type": "string", "description": "Unique id assigned by the server."},
        "resourceVersion": {
            "type": "string",
            "description": "Version of the object, for optimistic concurrency.",
        },
        "generation": {"type": "integer", "description": "Sequence number of the desired state's versions."},
        "creationTimestamp": {"type": "string", "format": "date-time", "description": "When it was created."},
        "deletionTimestamp": {
            "type": "string",
            "format": "date-time",
            "description": "When it will be deleted.",
        },
        "ownerReferences": {
            "type": "array",
            "items": {"type": "object"},
            "description": "Owners of the object.",
        },
    },
}


def doc_path(rtype: ResourceType) -> str:
    """The path under ``/openapi/v3/`` of the document that describes ``rtype``'s group version."""
    return f"apis/{rtype.group}/{rtype.version}" if rtype.group else f"api/{rtype.version}"


def _schema_name(rtype: ResourceType) -> str:
    reversed_group = ".".join(reversed(rtype.group.split("."))) if rtype.group else "io.k8s.api.core"
    return f"{reversed_group}.{rtype.version}.{rtype.kind}"


def _gvk(rtype: ResourceType) -> dict[str, str]:
    return {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}


def index(types: Iterable[ResourceType]) -> dict[str, Any]:
    """``/openapi/v3``: one entry per group/version, with a hash that changes when its types change."""
    by_path: dict[str, list[ResourceType]] = {}
    for rtype in types:
        by_path.setdefault(doc_path(rtype), []).append(rtype)
    paths = {}
    for path, members in sorted(by_path.items()):
        digest = hashlib.sha256(json.dumps(document(members), sort_keys=True).encode()).hexdigest()[:16]
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


_CONVENTIONS = "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md"
#: What kube-apiserver publishes for every kind's apiVersion, kind and metadata, whatever a CRD's schema
#: says about them (its own descriptions there are replaced, so `kubectl explain` shows these).
_TYPE_META = {
    "apiVersion": {
        "description": "APIVersion defines the versioned schema of this representation of an object. Servers "
        "should convert recognized schemas to the latest internal value, and may reject unrecognized "
        f"values. More info: {_CONVENTIONS}#resources",
        "type": "string",
    },
    "kind": {
        "description": "Kind is a string value representing the REST resource this object represents. "
        "Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In "
        f"CamelCase. More info: {_CONVENTIONS}#types-kinds",
        "type": "string",
    },
    "metadata": {
        "description": f"Standard object's metadata. More info: {_CONVENTIONS}#metadata",
        "allOf": [{"$ref": f"#/components/schemas/{_OBJECT_META}"}],
    },
}


def _with_meta(schema: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(schema)
    result["properties"] = {**(result.get("properties") or {}), **_TYPE_META}
    return result


def document(types: Iterable[ResourceType]) -> dict[str, Any]:
    """The OpenAPI v3 document of one group/version."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {_OBJECT_META: _META_SCHEMA}
    for rtype in types:
        base = f"/{doc_path(rtype)}/namespaces/{{namespace}}" if rtype.namespaced else f"/{doc_path(rtype)}"
        operation = {
            "x-kubernetes-group-version-kind": _gvk(rtype),
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            ],
            "responses": {"200": {"description": "OK"}},
        }
        paths[f"{base}/{rtype.plural}"] = {"post": operation}
        paths[f"{base}/{rtype.plural}/{{name}}"] = {"patch": operation, "put": operation}
        if rtype.custom and rtype.schema is not None:
            schema = _with_meta(rtype.schema)
        else:
            description = f"{rtype.kind} (schema not published by the kube emulator)"
            schema = _with_meta(
                {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}
            )
        schema["x-kubernetes-group-version-kind"] = [_gvk(rtype)]
        schemas[_schema_name(rtype)] = schema
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "unversioned"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
