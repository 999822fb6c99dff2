"""Label and field selectors with the API server's semantics, for list, watch and deletecollection.

Label selectors support ``=``, ``==``, ``!=``, ``in``, ``notin``, existence (``key``) and absence
(``!key``), plus ``>``/``<`` on integer values. As on the server, ``!=`` and ``notin`` also match
objects that lack the label.

Field selectors support ``=``, ``==`` and ``!=``. Custom resources accept only ``metadata.name``,
``metadata.namespace`` and the CRD's ``selectableFields``, like the real server; built-in resources
accept any dotted path (the real server has a per-type list, e.g. ``status.phase`` for pods; being more
permissive here keeps the emulator small and never rejects a selector a real server would accept).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")


class SelectorError(ValueError):
    """A selector that does not parse; the server answers 400 BadRequest with this message."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # one of: exists, !exists, =, !=, in, notin, gt, lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return present
            case "!exists":
                return not present
            case "=" | "in":
                return present and value in self.values
            case "!=" | "notin":
                return not present or value not in self.values
            case "gt" | "lt":
                try:
                    number = int(value) if value is not None else None
                except ValueError:
                    return False
                if number is None:
                    return False
                bound = int(self.values[0])
                return number > bound if self.operator == "gt" else number < bound
        raise AssertionError(self.operator)  # pragma: no cover


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return all(req.matches(labels or {}) for req in self.requirements)

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text or not text.strip():
            return cls()
        return cls(tuple(_parse_requirement(part) for part in _split_top_level(text)))


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``(...)`` value sets."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts]


def _check_key(key: str) -> str:
    if not _KEY_RE.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label key {key!r}")
    return key


def _check_value(value: str) -> str:
    if not _VALUE_RE.match(value) or len(value) > 63:
        raise SelectorError(f"unable to parse requirement: invalid label value: {value!r}")
    return value


_SET_RE = re.compile(r"^(?P<key>[^\s!=<>()]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_CMP_RE = re.compile(r"^(?P<key>[^\s!=<>()]+)\s*(?P<op>==|!=|=|>|<)\s*(?P<value>[^\s!=<>()]*)$")


def _parse_requirement(part: str) -> Requirement:
    if not part:
        raise SelectorError("found '', expected: identifier")
    if part.startswith("!"):
        return Requirement(_check_key(part[1:].strip()), "!exists")
    if match := _SET_RE.match(part):
        values = tuple(_check_value(v.strip()) for v in match["values"].split(","))
        if not any(values):
            raise SelectorError(
                "unable to parse requirement: for 'in', 'notin' operators, values set can't be empty"
            )
        return Requirement(_check_key(match["key"]), match["op"], tuple(sorted(set(values))))
    if match := _CMP_RE.match(part):
        op = {"==": "=", ">": "gt", "<": "lt"}.get(match["op"], match["op"])
        value = match["value"]
        if op in ("gt", "lt") and not re.fullmatch(r"-?\d+", value):
            raise SelectorError(
                "unable to parse requirement: for 'gt', 'lt' operators, "
                f"the value must be an integer: {value!r}"
            )
        return Requirement(
            _check_key(match["key"]), op, (_check_value(value) if op in ("=", "!=") else value,)
        )
    if re.fullmatch(r"[^\s!=<>(),]+", part):
        return Requirement(_check_key(part), "exists")
    raise SelectorError(f"unable to parse requirement: {part!r}")


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    negated: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        node: Any = obj
        for part in self.path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, bool):
            actual = "true" if node else "false"
        elif node is None:
            actual = ""
        else:
            actual = str(node)
        return (actual == self.value) != self.negated


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(req.matches(obj) for req in self.requirements)

    def exact_name(self) -> str | None:
        """The name when the selector pins one (watches on a single object use this)."""
        for req in self.requirements:
            if req.path == "metadata.name" and not req.negated:
                return req.value
        return None

    @classmethod
    def parse(
        cls, text: str | None, allowed: Collection[str] | Callable[[str], bool] | None = None
    ) -> FieldSelector:
        """Parse ``text``; ``allowed`` lists the supported field paths (``None`` accepts any path)."""
        if not text or not text.strip():
            return cls()
        requirements: list[FieldRequirement] = []
        for part in re.split(r"(?<!\\),", text):
            part = part.strip()
            match = re.fullmatch(r"(?P<path>[^=!\s]+)\s*(?P<op>==|!=|=)\s*(?P<value>.*)", part)
            if match is None:
                raise SelectorError(f"invalid selector: {text!r}; can't understand {part!r}")
            path = match["path"]
            ok = allowed is None or (allowed(path) if callable(allowed) else path in allowed)
            if not ok:
                raise SelectorError(f"field label not supported: {path}")
            value = re.sub(r"\\(.)", r"\1", match["value"])
            requirements.append(FieldRequirement(path, match["op"] == "!=", value))
        return cls(tuple(requirements))


def label_problems(labels: Any, path: str) -> list[tuple[str, Any, str]]:
    """Problems with ``metadata.labels`` as ``(field, value, detail)``; the server rejects them with 422."""
    problems: list[tuple[str, Any, str]] = []
    if not isinstance(labels, Mapping):
        return problems
    for key, value in labels.items():
        if not isinstance(key, str) or not _KEY_RE.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
            problems.append(
                (
                    path,
                    key,
                    "name part must consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character",
                )
            )
        if not isinstance(value, str) or not _VALUE_RE.match(value) or len(value) > 63:
            problems.append(
                (
                    f"{path}",
                    value,
                    "a valid label must be an empty string or consist of alphanumeric "
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                )
            )
    return problems
