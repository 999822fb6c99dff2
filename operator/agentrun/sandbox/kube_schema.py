"""Structural-schema handling for custom resources: pruning, defaulting and validation.

The order and the messages follow the API server, because tests compare the emulator with a real
cluster and operators read these errors:

1. pruning drops fields the schema does not declare (except below ``x-kubernetes-preserve-unknown-fields``)
   and ``null`` values of non-nullable fields; the dropped paths become ``Warning`` headers;
2. defaulting fills absent (or non-nullable ``null``) properties from ``default``, top-down, so defaults
   nested inside a defaulted object apply too;
3. validation reports :class:`FieldError` items whose text matches ``field.Error`` in apimachinery, e.g.
   ``spec.limits.maxIterations: Invalid value: 0: spec.limits.maxIterations in body should be greater than
   or equal to 1``.

``format`` is not checked (the server only checks a few string formats); ``int32``/``int64`` are accepted
as plain integers. Validation ratcheting (unchanged invalid values pass on update) is not emulated.
CEL rules (``x-kubernetes-validations``) run through :mod:`agentrun.sandbox.kube_cel`; rules outside its
subset are skipped with one log line per rule.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.sandbox import kube_cel

logger = logging.getLogger(__name__)

Schema = Mapping[str, Any]
_MISSING: Any = kube_cel._MISSING

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

_ROOT_FIELDS = ("apiVersion", "kind", "metadata")

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
_OMIT: Any = object()


def go_value(value: Any) -> str:
    """Render a value as Go's ``%v``/``%q`` would inside a field error."""
    if value is None:
        return '"null"'
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
    value: Any = _OMIT
    detail: str = ""

    def body(self) -> str:
        text = _TYPE_TEXT.get(self.type, self.type)
        if self.type not in _VALUELESS and self.value is not _OMIT:
            text = f"{text}: {go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}" if self.field else self.body()

    def cause(self) -> dict[str, str]:
        return {"reason": self.type, "message": self.body(), "field": self.field}


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, expected: str) -> bool:
    actual = _type_name(value)
    return actual == expected or (expected == "number" and actual == "integer")


# --------------------------------------------------------------------------------------------------------
# Pruning


def prune(obj: dict[str, Any], schema: Schema | None, *, root_meta: bool = True) -> list[str]:
    """Drop undeclared fields from ``obj`` in place; return their paths (for ``Warning`` headers)."""
    pruned: list[str] = []
    if root_meta and isinstance(obj.get("metadata"), dict):
        meta = obj["metadata"]
        for key in [k for k in meta if k not in OBJECT_META_FIELDS]:
            del meta[key]
            pruned.append(f"metadata.{key}")
    if schema is not None:
        _prune(obj, schema, "", pruned, root=True)
    return pruned


def _prune(value: Any, schema: Schema, path: str, pruned: list[str], *, root: bool = False) -> None:
    if isinstance(value, dict):
        props: Mapping[str, Any] | None = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True or extra is True
        embedded = schema.get("x-kubernetes-embedded-resource") is True
        for key in list(value):
            child = value[key]
            if (root or embedded) and key in _ROOT_FIELDS:
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
                _prune(child, sub, _child(path, key), pruned)
            elif not keep_unknown:
                del value[key]
                pruned.append(_child(path, key))
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


# --------------------------------------------------------------------------------------------------------
# Validation

_UNSUPPORTED_LOGGED: set[str] = set()
_COMPILED: dict[str, kube_cel.CelRule | None] = {}


def _compiled(rule: str) -> kube_cel.CelRule | None:
    if rule not in _COMPILED:
        try:
            _COMPILED[rule] = kube_cel.compile_rule(rule)
        except kube_cel.CelUnsupported as exc:
            _COMPILED[rule] = None
            if rule not in _UNSUPPORTED_LOGGED:
                _UNSUPPORTED_LOGGED.add(rule)
                logger.warning(
                    "kube emulator: ignoring a CEL rule outside the supported subset (%s): %s", exc, rule
                )
    return _COMPILED[rule]


def validate(obj: Any, schema: Schema | None, old: Any = _MISSING) -> list[FieldError]:
    """Validate ``obj`` (already pruned and defaulted); ``old`` enables CEL transition rules."""
    errors: list[FieldError] = []
    if schema is not None:
        _Validator(errors).check(obj, schema, "", old, root=True)
    return errors


class _Validator:
    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors

    def add(self, kind: str, path: str, value: Any = _OMIT, detail: str = "") -> None:
        self.errors.append(FieldError(kind, path, value, detail))

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.add("FieldValueInvalid", path, value, f"{path} in body {detail}")

    def check(self, value: Any, schema: Schema, path: str, old: Any, *, root: bool = False) -> None:
        before = len(self.errors)
        if not self._check_type(value, schema, path):
            return
        if value is not None:
            self._check_enum(value, schema, path)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._check_number(value, schema, path)
            elif isinstance(value, str):
                self._check_string(value, schema, path)
            elif isinstance(value, list):
                self._check_array(value, schema, path, old)
            elif isinstance(value, dict):
                self._check_object(value, schema, path, old, root=root)
            self._check_junctors(value, schema, path)
        if len(self.errors) == before:
            # The server skips CEL rules of values that already failed their schema.
            self._check_rules(value, schema, path, old)

    def _check_type(self, value: Any, schema: Schema, path: str) -> bool:
        if value is None:
            if schema.get("nullable") or not (schema.get("type") or schema.get("x-kubernetes-int-or-string")):
                return True
            expected = "integer,string" if schema.get("x-kubernetes-int-or-string") else schema["type"]
            self.add(
                "FieldValueTypeInvalid", path, None, f'{path} in body must be of type {expected}: "null"'
            )
            return False
        if schema.get("x-kubernetes-int-or-string"):
            if isinstance(value, str) or _type_name(value) == "integer":
                return True
            self.add(
                "FieldValueTypeInvalid",
                path,
                value,
                f'{path} in body must be of type integer,string: "{_type_name(value)}"',
            )
            return False
        expected = schema.get("type")
        if expected and not _type_ok(value, expected):
            self.add(
                "FieldValueTypeInvalid",
                path,
                value,
                f'{path} in body must be of type {expected}: "{_type_name(value)}"',
            )
            return False
        return True

    def _check_enum(self, value: Any, schema: Schema, path: str) -> None:
        enum = schema.get("enum")
        if enum is None or any(_same(value, allowed) for allowed in enum):
            return
        shown = [a if isinstance(a, str) else json.dumps(a, separators=(",", ":")) for a in enum]
        detail = "supported values: " + ", ".join(json.dumps(s, ensure_ascii=False) for s in shown)
        self.add("FieldValueNotSupported", path, value, detail)

    def _check_number(self, value: float, schema: Schema, path: str) -> None:
        minimum = schema.get("minimum")
        if minimum is not None:
            if schema.get("exclusiveMinimum") and value <= minimum:
                self.invalid(path, value, f"should be greater than {go_value(minimum)}")
            elif value < minimum:
                self.invalid(path, value, f"should be greater than or equal to {go_value(minimum)}")
        maximum = schema.get("maximum")
        if maximum is not None:
            if schema.get("exclusiveMaximum") and value >= maximum:
                self.invalid(path, value, f"should be less than {go_value(maximum)}")
            elif value > maximum:
                self.invalid(path, value, f"should be less than or equal to {go_value(maximum)}")
        multiple = schema.get("multipleOf")
        if multiple and (value / multiple) != int(value / multiple):
            self.invalid(path, value, f"should be a multiple of {go_value(multiple)}")

    def _check_string(self, value: str, schema: Schema, path: str) -> None:
        length = len(value)
        if (min_length := schema.get("minLength")) is not None and length < min_length:
            self.invalid(path, value, f"should be at least {min_length} chars long")
        if (max_length := schema.get("maxLength")) is not None and length > max_length:
            self.add("FieldValueTooLong", path, value, f"may not be longer than {max_length}")
        if (pattern := schema.get("pattern")) is not None and re.search(pattern, value) is None:
            self.invalid(path, value, f"should match '{pattern}'")

    def _check_array(self, value: list[Any], schema: Schema, path: str, old: Any) -> None:
        if (min_items := schema.get("minItems")) is not None and len(value) < min_items:
            self.invalid(path, value, f"should have at least {min_items} items")
        if (max_items := schema.get("maxItems")) is not None and len(value) > max_items:
            self.add("FieldValueTooMany", path, len(value), f"must have at most {max_items} items")
        list_type = schema.get("x-kubernetes-list-type")
        keys: list[str] = list(schema.get("x-kubernetes-list-map-keys") or [])
        old_by_key: dict[str, Any] = {}
        if list_type == "map" and keys and isinstance(old, list):
            old_by_key = {_map_key(item, keys): item for item in old if isinstance(item, dict)}
        seen: set[str] = set()
        items = schema.get("items")
        for index, item in enumerate(value):
            item_path = f"{path}[{index}]"
            if list_type == "set" or (list_type == "map" and keys and isinstance(item, dict)):
                identity = _map_key(item, keys) if list_type == "map" else json.dumps(item, sort_keys=True)
                if identity in seen:
                    shown = {k: item.get(k) for k in keys} if list_type == "map" else item
                    self.add("FieldValueDuplicate", item_path, shown)
                seen.add(identity)
            if isinstance(items, Mapping):
                old_item = old_by_key.get(_map_key(item, keys), _MISSING) if old_by_key else _MISSING
                self.check(item, items, item_path, old_item)

    def _check_object(
        self, value: dict[str, Any], schema: Schema, path: str, old: Any, *, root: bool
    ) -> None:
        props: Mapping[str, Any] = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                self.add("FieldValueRequired", _child(path, name))
        count = len(value)
        if (min_props := schema.get("minProperties")) is not None and count < min_props:
            self.invalid(path, value, f"should have at least {min_props} properties")
        if (max_props := schema.get("maxProperties")) is not None and count > max_props:
            self.add("FieldValueTooMany", path, count, f"must have at most {max_props} items")
        extra = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for key, child in value.items():
            if root and key in _ROOT_FIELDS:
                continue
            sub = props.get(key)
            if sub is None and isinstance(extra, Mapping):
                sub = extra
            if sub is not None:
                self.check(child, sub, _child(path, key), old_map.get(key, _MISSING))

    def _check_junctors(self, value: Any, schema: Schema, path: str) -> None:
        for sub in schema.get("allOf") or []:
            self.check(value, sub, path, _MISSING)
        any_of = schema.get("anyOf")
        if any_of and not any(_passes(value, sub, path) for sub in any_of):
            self.invalid(path, value, "must validate at least one schema (anyOf)")
        one_of = schema.get("oneOf")
        if one_of and sum(_passes(value, sub, path) for sub in one_of) != 1:
            self.invalid(path, value, "must validate one and only one schema (oneOf)")
        if (negated := schema.get("not")) is not None and _passes(value, negated, path):
            self.invalid(path, value, "must not validate the schema (not)")

    def _check_rules(self, value: Any, schema: Schema, path: str, old: Any) -> None:
        for entry in schema.get("x-kubernetes-validations") or []:
            source = entry.get("rule")
            if not isinstance(source, str) or value is None:
                continue
            rule = _compiled(source)
            if rule is None:
                continue
            if rule.uses_old_self and old is _MISSING and not entry.get("optionalOldSelf"):
                continue  # transition rules only run on updates that have an old value here
            message = entry.get("message") or f"failed rule: {source.strip()}"
            try:
                ok = rule.evaluate(value, old)
            except kube_cel.CelEvalError as exc:
                ok, message = False, f"{exc} evaluating rule: {source.strip()}"
            if ok:
                continue
            target = path
            if field_path := entry.get("fieldPath"):
                target = path + field_path if field_path.startswith(("[", ".")) else _child(path, field_path)
            reason = entry.get("reason") or "FieldValueInvalid"
            shown = schema.get("type") or ("object" if isinstance(value, dict) else _type_name(value))
            if reason in ("FieldValueForbidden", "FieldValueRequired"):
                self.add(reason, target, _OMIT, message)
            else:
                self.add(reason, target, shown, message)


def _passes(value: Any, schema: Schema, path: str) -> bool:
    errors: list[FieldError] = []
    _Validator(errors).check(value, schema, path, _MISSING)
    return not errors


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _map_key(item: Any, keys: list[str]) -> str:
    if not isinstance(item, dict):
        return json.dumps(item, sort_keys=True)
    return json.dumps([item.get(k) for k in keys])


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
