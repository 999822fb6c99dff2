"""Generating the CRD from the pydantic models, so the schema has one source of truth.

pydantic emits JSON Schema 2020-12; the API server wants a structural OpenAPI v3.0 subset:
no $ref, nullable instead of anyOf-null, no additionalProperties=false next to properties,
boolean exclusive bounds. This module is that translation and nothing else.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from agentrun.api import (
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    QUOTA_KIND,
    QUOTA_PLURAL,
    QUOTA_SHORT_NAMES,
    QUOTA_SINGULAR,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from agentrun.api.quota import AgentRunQuotaSpec, AgentRunQuotaStatus
from agentrun.api.spec import IMMUTABLE_SPEC_FIELDS, AgentRunSpec
from agentrun.api.status import AgentRunStatus

_DROP = {"title", "$defs", "discriminator"}
IMMUTABLE_MESSAGE = "is immutable once created (only cancel, approvals and ttlSecondsAfterFinished change)"


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        merged = {**target, **extra}
        return _resolve(merged, defs)
    return {k: _resolve(v, defs) for k, v in node.items() if k not in _DROP}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        options = [o for o in any_of if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {any_of!r} structurally")
        merged = {**options[0], **node}
        if len(options) < len(any_of):
            merged["nullable"] = True
        node = merged
        if node.get("default", 0) is None:
            del node["default"]
    if node.get("default", 0) is None:
        del node["default"]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if node.get("x-kubernetes-preserve-unknown-fields"):
        # Without a type from the model (Any), any JSON value is allowed, as the API server permits.
        node.pop("additionalProperties", None)
    elif node.get("additionalProperties") is False or "properties" in node:
        node.pop("additionalProperties", None)
    if "properties" in node:
        node["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _structural(node[key])
    return node


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _structural(_resolve(raw, defs))
    schema.pop("required", None) if not schema.get("required") else None
    return schema


def _default_nested_objects(schema: dict[str, Any]) -> None:
    """Let the API server fill nested defaults (maxIterations: 20 …) even when a parent is omitted."""
    for prop in schema.get("properties", {}).values():
        if prop.get("type") == "object" and "properties" in prop and not prop.get("nullable"):
            prop.setdefault("default", {})
            _default_nested_objects(prop)


#: Limits an AgentRunQuota may default: the operator fills them in (the smallest perRun default of the
#: namespace's quotas, else the built-in one), since a default stored by the API server would look
#: declared, and a quota's smaller maximum would then refuse runs that declared nothing.
OPERATOR_DEFAULTED_LIMITS = ("maxIterations", "timeoutSeconds")


def _operator_defaults(limits: dict[str, Any]) -> None:
    for name in OPERATOR_DEFAULTED_LIMITS:
        prop = limits["properties"][name]
        default = prop.pop("default")
        prop["description"] += (
            f" Default {default}, or the smallest perRun.{name}.default of the namespace's "
            "AgentRunQuotas (filled in by the operator, not stored in the spec)."
        )


def spec_schema() -> dict[str, Any]:
    schema = _schema_of(AgentRunSpec)
    _default_nested_objects(schema)
    _operator_defaults(schema["properties"]["limits"])
    for name in IMMUTABLE_SPEC_FIELDS:
        schema["properties"][name].setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": f"spec.{name} {IMMUTABLE_MESSAGE}"}
        )
    optional = [n for n in IMMUTABLE_SPEC_FIELDS if n not in schema.get("required", [])]
    schema["x-kubernetes-validations"] = [
        {
            "rule": " && ".join(f"has(self.{n}) == has(oldSelf.{n})" for n in optional),
            "message": f"fields of spec {IMMUTABLE_MESSAGE}; they cannot be added or removed either",
        },
        *schema.get("x-kubernetes-validations", []),
    ]
    return schema


def status_schema() -> dict[str, Any]:
    return _schema_of(AgentRunStatus)


def _without_nullable(node: Any) -> Any:
    """A quota leaves a limit out to not limit: null is refused instead of meaning the same thing."""
    if isinstance(node, list):
        return [_without_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {k: _without_nullable(v) for k, v in node.items() if k != "nullable"}


def quota_spec_schema() -> dict[str, Any]:
    schema = _schema_of(AgentRunQuotaSpec)
    _default_nested_objects(schema)
    result: dict[str, Any] = _without_nullable(schema)
    return result


def quota_status_schema() -> dict[str, Any]:
    return _schema_of(AgentRunQuotaStatus)


def _definition(
    *,
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...],
    columns: list[dict[str, str]],
    root: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def _root(description: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of the object."},
            "kind": {"type": "string", "description": "Kind of the object."},
            # A real API server refuses anything but `type` here ("metadata is
            # implicitly specified"), descriptions included.
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd() -> dict[str, Any]:
    return _definition(
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        short_names=SHORT_NAMES,
        columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Stop Reason", "type": "string", "jsonPath": ".status.stopReason"},
            {"name": "Iterations", "type": "integer", "jsonPath": ".status.iterations"},
            {"name": "Tokens", "type": "integer", "jsonPath": ".status.usage.totalTokens"},
            {"name": "Cost", "type": "string", "jsonPath": ".status.usage.costUSD"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        root=_root(
            "AgentRun runs one LLM agent loop (Anthropic tool use) to completion within declared limits "
            "and budgets.",
            {**spec_schema(), "description": "The desired run."},
            {**status_schema(), "description": "What happened (operator-owned)."},
        ),
    )


def quota_crd() -> dict[str, Any]:
    return _definition(
        kind=QUOTA_KIND,
        plural=QUOTA_PLURAL,
        singular=QUOTA_SINGULAR,
        short_names=QUOTA_SHORT_NAMES,
        columns=[
            {"name": "Window", "type": "string", "jsonPath": ".spec.window"},
            {"name": "Concurrent", "type": "string", "jsonPath": ".status.summary.concurrentRuns"},
            {"name": "Runs", "type": "string", "jsonPath": ".status.summary.runs"},
            {"name": "Tokens", "type": "string", "jsonPath": ".status.summary.tokens"},
            {"name": "Cost", "type": "string", "jsonPath": ".status.summary.costUSD"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        root=_root(
            "AgentRunQuota limits the AgentRuns of its namespace: concurrent runs, and runs, tokens and "
            "US dollars per window, checked before every model request; and the largest limits one run "
            "may declare. Every quota of a namespace applies.",
            {**quota_spec_schema(), "description": "The limits."},
            {
                **quota_status_schema(),
                "description": "The ledger of use against the limits (operator-owned).",
            },
        ),
    )


HEADER = "# Generated by `agentrun crd` from operator/agentrun/api; do not edit by hand.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100, allow_unicode=True)


def quota_crd_yaml() -> str:
    header = HEADER.replace("`agentrun crd`", "`agentrun crd --kind AgentRunQuota`")
    return header + yaml.safe_dump(quota_crd(), sort_keys=False, width=100, allow_unicode=True)
