"""The demo brain's input synthesis from tool schemas."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_sandbox.messages.brain import example_for_schema


@pytest.mark.parametrize(
    ("schema", "name", "expected"),
    [
        ({"type": "string"}, "namespace", "default"),
        ({"type": "string"}, "target_url", "https://example.com/"),
        ({"type": "string"}, "podName", "example"),
        ({"type": "string", "format": "date-time"}, "since", "2025-01-01T00:00:00Z"),
        ({"type": "string"}, "colour", "example-colour"),
        ({"type": "string", "enum": ["json", "yaml"]}, "format", "json"),
        ({"type": "string", "default": "prod"}, "env", "prod"),
        ({"type": "string", "maxLength": 3}, "namespace", "def"),
        ({"type": "integer"}, "port", 8080),
        ({"type": "integer", "minimum": 3, "maximum": 5}, "limit", 5),
        ({"type": "number", "minimum": 2}, "ratio", 2.0),
        ({"type": "boolean"}, "dry_run", True),
        ({"type": "boolean"}, "force", False),
        ({"type": ["string", "null"]}, "namespace", "default"),
        ({"anyOf": [{"type": "null"}, {"type": "integer"}]}, "count", 10),
        ({"type": "array", "items": {"type": "string"}}, "namespaces", ["default"]),
    ],
)
def test_schema_values_are_plausible_for_type_format_and_property_name(
    schema: dict[str, Any], name: str, expected: object
) -> None:
    assert example_for_schema(schema, name) == expected


def test_objects_get_their_required_properties_only_recursively() -> None:
    schema = {
        "type": "object",
        "properties": {
            "target": {
                "type": "object",
                "properties": {"namespace": {"type": "string"}, "kind": {"type": "string"}},
                "required": ["namespace"],
            },
            "optional": {"type": "string"},
        },
        "required": ["target"],
    }

    assert example_for_schema(schema) == {"target": {"namespace": "default"}}
