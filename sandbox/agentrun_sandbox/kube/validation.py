"""Validation of a custom resource against its structural schema, then its CEL rules, as the server does.

The OpenAPI pass reports :class:`~agentrun_sandbox.kube.schema.FieldError` items in the server's words;
CEL rules (``x-kubernetes-validations``) run after it, and not at all once it found a blocking error
(see :mod:`agentrun_sandbox.kube.schema`, which prunes and defaults before this runs).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from agentrun_sandbox.kube import cel as kube_cel
from agentrun_sandbox.kube.schema import (
    BLOCKING,
    MISSING,
    OMIT,
    ROOT_FIELDS,
    RULES_NOT_CHECKED,
    FieldError,
    Schema,
    child_path,
    go_value,
    too_long,
)

logger = logging.getLogger("agentrun_sandbox.kube.schema")

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


def validate(
    obj: Any,
    schema: Schema | None,
    old: Any = MISSING,
    *,
    prior: Sequence[FieldError] = (),
    body_root: str = "",
) -> list[FieldError]:
    """Validate ``obj`` (already pruned and defaulted); ``old`` enables CEL transition rules.

    ``prior`` are the errors found before the schema (``metadata``): a blocking one among them keeps the
    CEL rules from running too, as on the server.

    ``body_root`` is where the server's schema validator starts: a write to the status subresource is
    validated against the ``status`` schema alone, so its "in body" texts name paths below ``status``
    (``status.iterations: Invalid value: "string": iterations in body must be of type integer``) while
    the field stays the full path.
    """
    errors: list[FieldError] = []
    if schema is None:
        return errors
    validator = _Validator(errors, body_root)
    validator.check(obj, schema, "", old, root=True)
    if has_rules(schema):
        if any(error.type in BLOCKING for error in (*prior, *errors)):
            errors.append(RULES_NOT_CHECKED)
        else:
            validator.rules(obj, schema, "", old, root=True)
    return errors


def has_rules(schema: Any) -> bool:
    """Whether any ``x-kubernetes-validations`` is declared (the server builds no CEL validator otherwise)."""
    if isinstance(schema, Mapping):
        if schema.get("x-kubernetes-validations"):
            return True
        return any(
            has_rules(value) for key, value in schema.items() if key not in ("default", "enum", "example")
        )
    if isinstance(schema, list):
        return any(has_rules(item) for item in schema)
    return False


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


class _Validator:
    def __init__(self, errors: list[FieldError], body_root: str = "") -> None:
        self.errors = errors
        self.body_root = body_root

    def in_body(self, path: str) -> str:
        """``path`` as the schema validator names it in its messages (relative to ``body_root``)."""
        if not self.body_root or not (path == self.body_root or path.startswith(f"{self.body_root}.")):
            return path
        return path.removeprefix(self.body_root).removeprefix(".")

    def add(self, kind: str, path: str, value: Any = OMIT, detail: str = "") -> None:
        self.errors.append(FieldError(kind, path, value, detail))

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.add("FieldValueInvalid", path, value, f"{self.in_body(path)} in body {detail}")

    def check(self, value: Any, schema: Schema, path: str, old: Any, *, root: bool = False) -> None:
        """The OpenAPI pass (kube-openapi's validator); CEL rules are :meth:`rules`."""
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

    def rules(self, value: Any, schema: Schema, path: str, old: Any, *, root: bool = False) -> None:
        """The CEL pass, in the server's order: a node's rules, its ``allOf`` rules, then its children."""
        if value is None:
            return
        self._check_rules(value, schema, path, old)
        for sub in schema.get("allOf") or []:
            self.rules(value, sub, path, old)
        if isinstance(value, dict):
            for key, child, sub, old_child in _properties(value, schema, old, root=root):
                self.rules(child, sub, child_path(path, key), old_child)
        elif isinstance(value, list) and isinstance(items := schema.get("items"), Mapping):
            olds = _old_items(value, schema, old)
            for index, item in enumerate(value):
                self.rules(item, items, f"{path}[{index}]", olds[index])

    def _check_type(self, value: Any, schema: Schema, path: str) -> bool:
        if value is None:
            if schema.get("nullable") or not (schema.get("type") or schema.get("x-kubernetes-int-or-string")):
                return True
            expected = "integer,string" if schema.get("x-kubernetes-int-or-string") else schema["type"]
            self.add(
                "FieldValueTypeInvalid",
                path,
                "null",
                f'{self.in_body(path)} in body must be of type {expected}: "null"',
            )
            return False
        if schema.get("x-kubernetes-int-or-string"):
            if isinstance(value, str) or _type_name(value) == "integer":
                return True
            self.add(
                "FieldValueTypeInvalid",
                path,
                _type_name(value),  # kube-openapi's InvalidType carries the type name, not the value
                f'{self.in_body(path)} in body must be of type integer,string: "{_type_name(value)}"',
            )
            return False
        expected = schema.get("type")
        if expected and not _type_ok(value, expected):
            self.add(
                "FieldValueTypeInvalid",
                path,
                _type_name(value),
                f'{self.in_body(path)} in body must be of type {expected}: "{_type_name(value)}"',
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
        """maxLength, minLength, pattern: only the first that fails is reported (kube-openapi's order)."""
        length = len(value)
        if (max_length := schema.get("maxLength")) is not None and length > max_length:
            self.add("FieldValueTooLong", path, value, too_long(max_length))
        elif (min_length := schema.get("minLength")) is not None and length < min_length:
            self.invalid(path, value, f"should be at least {min_length} chars long")
        elif (pattern := schema.get("pattern")) is not None and re.search(pattern, value) is None:
            self.invalid(path, value, f"should match '{pattern}'")

    def _check_array(self, value: list[Any], schema: Schema, path: str, old: Any) -> None:
        if (min_items := schema.get("minItems")) is not None and len(value) < min_items:
            self.invalid(path, value, f"should have at least {min_items} items")
        if (max_items := schema.get("maxItems")) is not None and len(value) > max_items:
            self.add("FieldValueTooMany", path, len(value), f"must have at most {max_items} items")
        list_type = schema.get("x-kubernetes-list-type")
        keys: list[str] = list(schema.get("x-kubernetes-list-map-keys") or [])
        olds = _old_items(value, schema, old)
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
                self.check(item, items, item_path, olds[index])

    def _check_object(
        self, value: dict[str, Any], schema: Schema, path: str, old: Any, *, root: bool
    ) -> None:
        count = len(value)
        if (min_props := schema.get("minProperties")) is not None and count < min_props:
            self.invalid(path, value, f"should have at least {min_props} properties")
        if (max_props := schema.get("maxProperties")) is not None and count > max_props:
            self.add("FieldValueTooMany", path, count, f"must have at most {max_props} items")
        for key, child, sub, old_child in _properties(value, schema, old, root=root):
            self.check(child, sub, child_path(path, key), old_child)
        # After the properties' own errors, in declared order (those come in Go's random map order).
        for name in schema.get("required") or []:
            if name not in value:
                self.add("FieldValueRequired", child_path(path, name))

    def _check_junctors(self, value: Any, schema: Schema, path: str) -> None:
        for sub in schema.get("allOf") or []:
            self.check(value, sub, path, MISSING)
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
            if rule.uses_old_self and old is MISSING and not entry.get("optionalOldSelf"):
                continue  # transition rules only run on updates that have an old value here
            type_name = schema.get("type") or ("object" if isinstance(value, dict) else _type_name(value))
            try:
                ok = rule.evaluate(value, old)
            except kube_cel.CelEvalError as exc:
                # An evaluation error names the schema type, not the value (field.Invalid(path, sts.Type)).
                self.add("FieldValueInvalid", path, type_name, f"{exc} evaluating rule: {source.strip()}")
                continue
            if ok:
                continue
            message = entry.get("message") or f"failed rule: {source.strip()}"
            target = path
            if field_path := entry.get("fieldPath"):
                target = (
                    path + field_path if field_path.startswith(("[", ".")) else child_path(path, field_path)
                )
            reason = entry.get("reason") or "FieldValueInvalid"
            # A failed rule shows a scalar's value and omits objects and arrays (apiextensions' cel
            # validator since Kubernetes 1.3x), e.g. `spec.approvals: Invalid value: <message>`.
            shown = OMIT if type_name in ("object", "array") else value
            if reason in ("FieldValueForbidden", "FieldValueRequired"):
                self.add(reason, target, OMIT, message)
            else:
                self.add(reason, target, shown, message)


def _properties(
    value: dict[str, Any], schema: Schema, old: Any, *, root: bool
) -> Iterator[tuple[str, Any, Schema, Any]]:
    """Each property with a schema (its own, else additionalProperties) and its old value; the root's
    apiVersion, kind and metadata are the server's, not the schema's."""
    props: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    old_map = old if isinstance(old, dict) else {}
    for key, child in value.items():
        if root and key in ROOT_FIELDS:
            continue
        sub = props.get(key)
        if sub is None and isinstance(extra, Mapping):
            sub = extra
        if sub is not None:
            yield key, child, sub, old_map.get(key, MISSING)


def _old_items(value: list[Any], schema: Schema, old: Any) -> list[Any]:
    """Each item's old value: only items of a map-type list correlate with the old list (by their keys)."""
    keys: list[str] = list(schema.get("x-kubernetes-list-map-keys") or [])
    if schema.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
        return [MISSING] * len(value)
    by_key = {_map_key(item, keys): item for item in old if isinstance(item, dict)}
    return [by_key.get(_map_key(item, keys), MISSING) for item in value]


def _passes(value: Any, schema: Schema, path: str) -> bool:
    errors: list[FieldError] = []
    _Validator(errors).check(value, schema, path, MISSING)
    return not errors


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _map_key(item: Any, keys: list[str]) -> str:
    if not isinstance(item, dict):
        return json.dumps(item, sort_keys=True)
    return json.dumps([item.get(k) for k in keys])
