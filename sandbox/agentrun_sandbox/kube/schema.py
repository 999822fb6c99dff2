"""Structural-schema handling for custom resources: pruning, defaulting and the errors validation reports.

The order and the messages follow the API server, because tests compare the emulator with a real
cluster and operators read these errors:

1. pruning drops fields the schema does not declare (except below ``x-kubernetes-preserve-unknown-fields``)
   and ``null`` values of non-nullable fields; the dropped paths become ``Warning`` headers;
2. defaulting fills absent (or non-nullable ``null``) properties from ``default``, top-down, so defaults
   nested inside a defaulted object apply too;
3. validation (:mod:`agentrun_sandbox.kube.validation`) reports :class:`FieldError` items whose text
   matches ``field.Error`` in apimachinery, e.g.
   ``spec.limits.maxIterations: Invalid value: 0: spec.limits.maxIterations in body should be greater than
   or equal to 1``;
4. CEL rules run after the whole OpenAPI pass, and not at all once it found a blocking error (a wrong
   type, a missing required field, an enum miss, too long, too many): the server then appends
   :data:`RULES_NOT_CHECKED` instead (``hasBlockingErr`` in apiextensions' customresource strategy).

``format`` is not checked (the server only checks a few string formats); ``int32``/``int64`` are accepted
as plain integers. Validation ratcheting (unchanged invalid values pass on update) is not emulated.
CEL rules (``x-kubernetes-validations``) run through :mod:`agentrun_sandbox.kube.cel`; rules outside its
subset are skipped with one log line per rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.kube import cel as kube_cel

Schema = Mapping[str, Any]
#: An absent value (no old object on create, a field not set): CEL's own marker, so rules see it as absent.
MISSING: Any = kube_cel.MISSING

#: ObjectMeta fields; anything else under ``metadata`` is dropped like an unknown field of a Go struct.
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)

#: The fields of every object's root (and of an embedded resource) that its schema need not declare.
ROOT_FIELDS = ("apiVersion", "kind", "metadata")

# Messages per field.ErrorType, as ErrorType.String() renders them.
_TYPE_TEXT = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueTypeInvalid": "Invalid value",
    "FieldValueRequired": "Required value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
}
_VALUELESS = {"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong"}
#: :attr:`FieldError.value` when the error shows no value (``field.Error`` with an omitted value).
OMIT: Any = object()


def go_value(value: Any) -> str:
    """Render a value as Go's ``%v``/``%q`` would inside a field error."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e21:
            return str(int(value))
        return repr(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """One cause of a 422; ``str()`` is the line the server prints."""

    type: str
    field: str
    value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        text = _TYPE_TEXT.get(self.type, self.type)
        if self.type not in _VALUELESS and self.value is not OMIT:
            text = f"{text}: {go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}" if self.field else self.body()

    def cause(self) -> dict[str, str]:
        return {"reason": self.type, "message": self.body(), "field": self.field}


#: What the server appends instead of CEL errors when the OpenAPI pass found a blocking error.
RULES_NOT_CHECKED = FieldError(
    "FieldValueInvalid",
    "<nil>",
    None,
    "some validation rules were not checked because the object was invalid; correct the existing errors "
    "to complete validation",
)
#: field.ErrorTypes that keep CEL rules from running (``hasBlockingErr``).
BLOCKING = frozenset(
    {
        "FieldValueNotSupported",
        "FieldValueRequired",
        "FieldValueTooLong",
        "FieldValueTooMany",
        "FieldValueTypeInvalid",
    }
)


def child_path(path: str, key: str) -> str:
    """The field path of ``key`` under ``path``, as field errors and pruning warnings print it."""
    return f"{path}.{key}" if path else key


# --------------------------------------------------------------------------------------------------------
# Pruning


def prune(obj: dict[str, Any], schema: Schema | None, *, root_meta: bool = True) -> list[str]:
    """Drop undeclared fields from ``obj`` in place; return their paths (for ``Warning`` headers)."""
    pruned: list[str] = []
    if root_meta and isinstance(obj.get("metadata"), dict):
        meta = obj["metadata"]
        for key in sorted(k for k in meta if k not in OBJECT_META_FIELDS):
            del meta[key]
            pruned.append(f"metadata.{key}")
    if schema is not None:
        in_schema: list[str] = []
        _prune(obj, schema, "", in_schema, root=True)
        pruned += sorted(in_schema)  # the server sorts them (its walk goes in Go's random map order)
    return pruned


def _prune(value: Any, schema: Schema, path: str, pruned: list[str], *, root: bool = False) -> None:
    if isinstance(value, dict):
        props: Mapping[str, Any] | None = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True or extra is True
        embedded = schema.get("x-kubernetes-embedded-resource") is True
        for key in list(value):
            child = value[key]
            if (root or embedded) and key in ROOT_FIELDS:
                continue
            sub: Schema | None = None
            if props is not None and key in props:
                sub = props[key]
            elif isinstance(extra, Mapping):
                sub = extra
            if sub is not None:
                if child is None and not sub.get("nullable"):
                    del value[key]
                    continue
                _prune(child, sub, child_path(path, key), pruned)
            elif not keep_unknown:
                del value[key]
                pruned.append(child_path(path, key))
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, child in enumerate(value):
                _prune(child, items, f"{path}[{index}]", pruned)


# --------------------------------------------------------------------------------------------------------
# Defaulting


def apply_defaults(value: Any, schema: Schema | None) -> None:
    """Fill defaults in place, top-down, as the server does before validation."""
    if schema is None:
        return
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties") or {}
        for key, sub in props.items():
            if "default" in sub and (key not in value or (value[key] is None and not sub.get("nullable"))):
                value[key] = json.loads(json.dumps(sub["default"]))
        extra = schema.get("additionalProperties")
        for key, child in value.items():
            if key in props:
                apply_defaults(child, props[key])
            elif isinstance(extra, Mapping):
                apply_defaults(child, extra)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for child in value:
                apply_defaults(child, items)


def too_long(max_length: int) -> str:
    """field.TooLong's detail."""
    return f"may not be more than {max_length} {'byte' if max_length == 1 else 'bytes'}"


def invalid_message(qualified_kind: str, name: str, errors: list[FieldError]) -> str:
    """The Status message of a 422, formatted like ``errors.NewInvalid`` (duplicates dropped)."""
    lines: list[str] = []
    for error in errors:
        if str(error) not in lines:
            lines.append(str(error))
    head = f'{qualified_kind} "{name}" is invalid'
    if not lines:
        return head
    if len(lines) == 1:
        return f"{head}: {lines[0]}"
    return f"{head}: [{', '.join(lines)}]"
