"""Whether a JSON Schema is usable here: valid for its draft, and needing nothing from the network.

Shared by spec.output.schema and webhook tools' inputSchema; validators built from these schemas
use an empty registry, so a $ref is only ever resolved inside the schema."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import jsonschema
import jsonschema.protocols
import referencing.jsonschema

#: The largest schema accepted, as compact JSON: it rides in every request's system prompt.
MAX_OUTPUT_SCHEMA_CHARS = 65_536


def json_schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot check answers, or None: caught at admission, before anything is spent."""
    size = len(json.dumps(schema, separators=(",", ":"), default=str))
    if size > MAX_OUTPUT_SCHEMA_CHARS:
        return f"is {size} characters as JSON; at most {MAX_OUTPUT_SCHEMA_CHARS} are allowed"
    validator = json_schema_validator_class(schema)
    if validator is None:
        return f"$schema {schema.get('$schema')!r} is not a JSON Schema draft this operator knows"
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path).lstrip(".")
        return f"not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    return _unresolvable_ref(schema)


def json_schema_validator_class(schema: dict[str, Any]) -> type[jsonschema.protocols.Validator] | None:
    """The draft ``$schema`` names (2020-12 when it names none), or None for an unknown one."""
    dialect = schema.get("$schema")
    if dialect is None:
        return jsonschema.Draft202012Validator
    if not isinstance(dialect, str):
        return None
    try:
        referencing.jsonschema.specification_with(dialect)
    except referencing.jsonschema.UnknownDialect:
        return None
    return jsonschema.validators.validator_for(schema)


#: Keywords whose values are data, not subschemas: a "$ref" key inside them is no reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _unresolvable_ref(schema: dict[str, Any]) -> str | None:
    """The first $ref that would need the network or points at nothing, described; else None.

    Validation never fetches anything (the operator has no business reaching arbitrary URLs
    from inside a cluster), so a schema must carry what it references, under $defs.
    """

    def walk(node: Any, resource: dict[str, Any]) -> str | None:
        if isinstance(node, list):
            return next((p for item in node if (p := walk(item, resource)) is not None), None)
        if not isinstance(node, dict):
            return None
        if isinstance(node.get("$id"), str) and node is not schema:
            resource = node
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith(META_SCHEMA_PREFIXES):
            if not ref.startswith("#"):
                return (
                    f"$ref {ref!r} points outside the schema; only references inside it "
                    "(#/$defs/...) are followed"
                )
            if ref.startswith("#/") and not _pointer_exists(resource, ref[1:]):
                return f"$ref {ref!r} points at nothing in the schema"
        for key, value in node.items():
            if key not in _DATA_KEYWORDS and (problem := walk(value, resource)) is not None:
                return problem
        return None

    return walk(schema, schema)


META_SCHEMA_PREFIXES = ("http://json-schema.org/", "https://json-schema.org/")


def _pointer_exists(document: Any, pointer: str) -> bool:
    node = document
    for raw in pointer.split("/")[1:]:
        token = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True
