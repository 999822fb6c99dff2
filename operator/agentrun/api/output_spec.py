"""Structured answers: spec.output.schema, the JSON Schema a run's final answer must match."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from agentrun.api.json_schemas import json_schema_problem
from agentrun.api.spec_base import SpecModel


class OutputSpec(SpecModel):
    """A structured answer: the final answer must be JSON valid against a JSON Schema."""

    json_schema: dict[str, Any] = Field(
        alias="schema",
        description=(
            "JSON Schema (draft 2020-12 unless $schema names another) the final answer must match. "
            "It is shown to the model in the system prompt; only references inside it are followed. "
            "The validated JSON is in status.output."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description=(
            "Answers that are not valid JSON for the schema are sent back with the validation errors "
            "this many times; then the run ends InvalidOutput."
        ),
    )

    @field_validator("json_schema")
    @classmethod
    def _usable_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        problem = json_schema_problem(schema)
        if problem is not None:
            raise ValueError(problem)
        return schema
