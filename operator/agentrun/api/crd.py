"""Generating the CRD from the pydantic models, so the schema has one source of truth.

pydantic emits JSON Schema 2020-12; the API server wants a structural OpenAPI v3.0 subset:
no $ref, nullable instead of anyOf-null, no additionalProperties=false next to properties,
boolean exclusive bounds. This module is that translation and nothing else.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from agentrun.api import (
    AGENT_KIND,
    AGENT_PLURAL,
    AGENT_SHORT_NAMES,
    AGENT_SINGULAR,
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    QUOTA_KIND,
    QUOTA_PLURAL,
    QUOTA_SHORT_NAMES,
    QUOTA_SINGULAR,
    SCHEDULE_KIND,
    SCHEDULE_PLURAL,
    SCHEDULE_SHORT_NAMES,
    SCHEDULE_SINGULAR,
    SHORT_NAMES,
    SINGULAR,
    TEMPLATE_KIND,
    TEMPLATE_PLURAL,
    TEMPLATE_SHORT_NAMES,
    TEMPLATE_SINGULAR,
    VERSION,
)
from agentrun.api.agent import AgentSpec, AgentStatus
from agentrun.api.quota import AgentRunQuotaSpec, AgentRunQuotaStatus
from agentrun.api.sandbox_spec import SandboxTemplateSpec
from agentrun.api.schedule import AgentScheduleSpec, AgentScheduleStatus
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
#: namespace's quotas, else the built-in one).
OPERATOR_DEFAULTED_LIMITS = ("maxIterations", "timeoutSeconds")


def _described_defaults(node: dict[str, Any], *, quota_limits: bool = False) -> None:
    """Defaults go into descriptions instead of the stored object: what a spec leaves out stays out.

    A default stored by the API server would look declared: a run from an Agent (spec.agentRef)
    would seem to set every model and limit field itself, and a quota's smaller maximum would refuse
    runs that declared nothing. pydantic fills the same defaults in when the operator reads a spec.
    """
    for name, prop in node.get("properties", {}).items():
        if "default" in prop:
            default = prop.pop("default")
            if default not in ({}, []):
                shown = default if isinstance(default, str) else json.dumps(default)
                if quota_limits and name in OPERATOR_DEFAULTED_LIMITS:
                    prop["description"] += (
                        f" Default {shown}, or the smallest perRun.{name}.default of the namespace's "
                        "AgentRunQuotas (filled in by the operator, not stored in the spec)."
                    )
                else:
                    prop["description"] = f"{prop.get('description', '').rstrip()} Default {shown}.".lstrip()
        _described_defaults(prop, quota_limits=name == "limits")
        for key in ("items", "additionalProperties"):
            if isinstance(prop.get(key), dict):
                _described_defaults(prop[key])


def _immutable(schema: dict[str, Any]) -> dict[str, Any]:
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


def spec_schema() -> dict[str, Any]:
    schema = _schema_of(AgentRunSpec)
    _described_defaults(schema)
    return _immutable(schema)


def agent_spec_schema() -> dict[str, Any]:
    schema = _schema_of(AgentSpec)
    _described_defaults(schema)
    return schema


def agent_status_schema() -> dict[str, Any]:
    return _schema_of(AgentStatus)


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


def schedule_spec_schema() -> dict[str, Any]:
    schema = _schema_of(AgentScheduleSpec)
    # runSpec is copied into each run as written: defaults stored here would look declared by the run
    # (and a default limit above the Agent's would break tighten-only).
    _described_defaults(schema["properties"]["runSpec"])
    return schema


def schedule_status_schema() -> dict[str, Any]:
    return _schema_of(AgentScheduleStatus)


def template_spec_schema() -> dict[str, Any]:
    schema = _schema_of(SandboxTemplateSpec)
    _described_defaults(schema)  # as spec.sandbox's: the reference reads the same for both
    return schema


@dataclass(frozen=True)
class _Kind:
    """What tells one kind's CRD from another's; everything else about a CRD is the same for all."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[dict[str, Any], ...]
    description: str
    spec: Callable[[], dict[str, Any]]
    spec_description: str
    #: None: a kind the operator only reads has no status (and no status subresource).
    status: Callable[[], dict[str, Any]] | None = None
    status_description: str = ""


_AGENTRUN = _Kind(
    kind=KIND,
    plural=PLURAL,
    singular=SINGULAR,
    short_names=SHORT_NAMES,
    columns=(
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Stop Reason", "type": "string", "jsonPath": ".status.stopReason"},
        {"name": "Iterations", "type": "integer", "jsonPath": ".status.iterations"},
        {"name": "Tokens", "type": "integer", "jsonPath": ".status.usage.totalTokens"},
        {"name": "Cost", "type": "string", "jsonPath": ".status.usage.costUSD"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Agent", "type": "string", "jsonPath": ".spec.agentRef.name", "priority": 1},
    ),
    description="AgentRun runs one LLM agent loop (Anthropic tool use) to completion within declared limits "
    "and budgets.",
    spec=spec_schema,
    spec_description="The desired run.",
    status=status_schema,
    status_description="What happened (operator-owned).",
)

_QUOTA = _Kind(
    kind=QUOTA_KIND,
    plural=QUOTA_PLURAL,
    singular=QUOTA_SINGULAR,
    short_names=QUOTA_SHORT_NAMES,
    columns=(
        {"name": "Window", "type": "string", "jsonPath": ".spec.window"},
        {"name": "Concurrent", "type": "string", "jsonPath": ".status.summary.concurrentRuns"},
        {"name": "Runs", "type": "string", "jsonPath": ".status.summary.runs"},
        {"name": "Tokens", "type": "string", "jsonPath": ".status.summary.tokens"},
        {"name": "Cost", "type": "string", "jsonPath": ".status.summary.costUSD"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
    description="AgentRunQuota limits the AgentRuns of its namespace: concurrent runs, and runs, tokens and "
    "US dollars per window, checked before every model request; and the largest limits one run "
    "may declare. Every quota of a namespace applies.",
    spec=quota_spec_schema,
    spec_description="The limits.",
    status=quota_status_schema,
    status_description="The ledger of use against the limits (operator-owned).",
)

_AGENT = _Kind(
    kind=AGENT_KIND,
    plural=AGENT_PLURAL,
    singular=AGENT_SINGULAR,
    short_names=AGENT_SHORT_NAMES,
    columns=(
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Pool", "type": "integer", "jsonPath": ".status.warmPool.ready", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
    description="Agent is an AgentRun's definition without its task: system prompt, model, tools, limits. "
    "AgentRuns run it with spec.agentRef and may only narrow its limits.",
    spec=agent_spec_schema,
    spec_description="What every run of this Agent does.",
    status=agent_status_schema,
    status_description="What the operator saw (operator-owned).",
)

_SCHEDULE = _Kind(
    kind=SCHEDULE_KIND,
    plural=SCHEDULE_PLURAL,
    singular=SCHEDULE_SINGULAR,
    short_names=SCHEDULE_SHORT_NAMES,
    columns=(
        {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
        {"name": "Time Zone", "type": "string", "jsonPath": ".spec.timeZone", "priority": 1},
        {"name": "Agent", "type": "string", "jsonPath": ".spec.agentRef.name", "priority": 1},
        {"name": "Suspend", "type": "boolean", "jsonPath": ".spec.suspend"},
        {"name": "Last Schedule", "type": "date", "jsonPath": ".status.lastScheduleTime"},
        {"name": "Next", "type": "string", "jsonPath": ".status.nextScheduleTime"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
    description="AgentSchedule creates AgentRuns of an Agent on a cron schedule, as a CronJob creates Jobs: "
    "a concurrency policy, a starting deadline for missed times, history limits and suspend.",
    spec=schedule_spec_schema,
    spec_description="When to create runs, and which.",
    status=schedule_status_schema,
    status_description="What the schedule did (operator-owned).",
)


_TEMPLATE = _Kind(
    kind=TEMPLATE_KIND,
    plural=TEMPLATE_PLURAL,
    singular=TEMPLATE_SINGULAR,
    short_names=TEMPLATE_SHORT_NAMES,
    columns=(
        {"name": "Image", "type": "string", "jsonPath": ".spec.image"},
        {"name": "CPU", "type": "string", "jsonPath": ".spec.resources.limits.cpu"},
        {"name": "Memory", "type": "string", "jsonPath": ".spec.resources.limits.memory"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ),
    description="SandboxTemplate is a sandbox pod kept once for many runs: AgentRuns and Agents name it in "
    "spec.sandbox.templateRef and override its fields. A run reads it once, when it starts.",
    spec=template_spec_schema,
    spec_description="The sandbox: the fields of AgentRun spec.sandbox but templateRef and warmPool.",
)


def _definition(kind: _Kind) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    **({"subresources": {"status": {}}} if kind.status is not None else {}),
                    "additionalPrinterColumns": copy.deepcopy(list(kind.columns)),
                    "schema": {"openAPIV3Schema": _root(kind)},
                }
            ],
        },
    }


def _root(kind: _Kind) -> dict[str, Any]:
    return {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version of the object."},
            "kind": {"type": "string", "description": "Kind of the object."},
            # A real API server refuses anything but `type` here ("metadata is
            # implicitly specified"), descriptions included.
            "metadata": {"type": "object"},
            "spec": {**kind.spec(), "description": kind.spec_description},
            **({"status": {**kind.status(), "description": kind.status_description}} if kind.status else {}),
        },
    }


def crd() -> dict[str, Any]:
    return _definition(_AGENTRUN)


def quota_crd() -> dict[str, Any]:
    return _definition(_QUOTA)


def agent_crd() -> dict[str, Any]:
    return _definition(_AGENT)


def schedule_crd() -> dict[str, Any]:
    return _definition(_SCHEDULE)


def template_crd() -> dict[str, Any]:
    return _definition(_TEMPLATE)


HEADER = "# Generated by `agentrun crd` from operator/agentrun/api; do not edit by hand.\n"


def _yaml(document: dict[str, Any], kind: str | None = None) -> str:
    header = HEADER if kind is None else HEADER.replace("`agentrun crd`", f"`agentrun crd --kind {kind}`")
    return header + yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True)


def crd_yaml() -> str:
    return _yaml(crd())


def quota_crd_yaml() -> str:
    return _yaml(quota_crd(), QUOTA_KIND)


def agent_crd_yaml() -> str:
    return _yaml(agent_crd(), AGENT_KIND)


def schedule_crd_yaml() -> str:
    return _yaml(schedule_crd(), SCHEDULE_KIND)


def template_crd_yaml() -> str:
    return _yaml(template_crd(), TEMPLATE_KIND)


def all_crds_yaml() -> str:
    """Every CRD the operator serves, as one multi-document stream (`agentrun crd --all`).

    Why one stream: the operator's advice for a missing CRD must install all of them in one command
    (``agentrun crd --all | kubectl apply -f -``); advising one CRD at a time left the others missing.
    """
    return "---\n".join(
        (crd_yaml(), quota_crd_yaml(), agent_crd_yaml(), schedule_crd_yaml(), template_crd_yaml())
    )
