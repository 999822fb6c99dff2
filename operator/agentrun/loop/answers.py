"""Structured answers: a final answer checked as JSON against spec.output.schema.

What counts as the answer is strict on purpose, so a pipeline never gets JSON picked out of prose
by a guess: the whole text is one JSON value, or one fenced code block (```json or a bare ```)
holding it with nothing around it. NaN and Infinity are refused, as they are not JSON. Everything
else goes back to the model with the reason, and the rule is said in that message and up front in
the system prompt, so the first answer usually passes.

Nothing is fetched while validating: references resolve inside the schema (and to the JSON Schema
meta-schemas) only; the admit phase already refused schemas that point elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import referencing
import referencing.exceptions

from agentrun.api.json_schemas import json_schema_validator_class

MAX_ERRORS = 8
MAX_ERROR_CHARS = 300
FENCED = re.compile(r"\A```(?:json)?[ \t]*\n(?P<body>.*?)\n?```\Z", re.DOTALL | re.IGNORECASE)
ACCEPTED = (
    "one JSON value with nothing before or after it (a single ```json code block around it is also accepted)"
)


class UnusableSchema(Exception):
    """The schema cannot check an answer (a reference that resolves to nothing): not the model's fault."""


@dataclass(frozen=True)
class CheckedAnswer:
    """The answer's JSON text and value when it passed; else why not, one line per problem."""

    text: str
    value: Any = None
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.errors


def instructions(schema: Mapping[str, Any]) -> str:
    """What the system prompt says about the answer's format; stable, so it stays in the cache."""
    return (
        "Your final answer (the reply in which you call no more tools) must be "
        f"{ACCEPTED}, valid against this JSON Schema. An answer that is not is sent back "
        "to you with the validation errors.\n\n"
        f"```json\n{json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False)}\n```"
    )


def with_instructions(system: str | None, schema: Mapping[str, Any]) -> str:
    return f"{system}\n\n{instructions(schema)}" if system else instructions(schema)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check(text: str, schema: Mapping[str, Any]) -> CheckedAnswer:
    """The answer parsed and validated against ``schema``; raises UnusableSchema for a broken schema."""
    stripped = text.strip()
    fenced = FENCED.match(stripped)
    body = fenced.group("body").strip() if fenced else stripped
    if not body:
        return CheckedAnswer(body, errors=("not JSON: the answer is empty",))
    try:
        value = json.loads(body, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        return CheckedAnswer(body, errors=(f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",))
    except ValueError as exc:
        return CheckedAnswer(body, errors=(f"not JSON: {exc}",))
    validator_class = json_schema_validator_class(dict(schema)) or jsonschema.Draft202012Validator
    # An empty registry: the meta-schemas resolve from the package, anything remote fails
    # instead of being fetched (jsonschema's default registry would fetch it).
    validator = validator_class(dict(schema), registry=referencing.Registry())
    try:
        found = sorted(validator.iter_errors(value), key=lambda e: e.json_path)
    except referencing.exceptions.Unresolvable as exc:
        raise UnusableSchema(f"spec.output.schema: a reference does not resolve: {exc}") from exc
    if not found:
        return CheckedAnswer(body, value)
    errors = [_cut(f"at {e.json_path}: {e.message}") for e in found[:MAX_ERRORS]]
    if len(found) > MAX_ERRORS:
        errors.append(f"... and {len(found) - MAX_ERRORS} more")
    return CheckedAnswer(body, errors=tuple(errors))


def _cut(line: str) -> str:
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def retry_prompt(errors: tuple[str, ...], retry: int, max_retries: int) -> str:
    """The user turn that sends an invalid answer back: what is wrong and what is accepted."""
    listed = "\n".join(f"- {e}" for e in errors)
    return (
        "Your answer was not accepted. The final answer must be "
        f"{ACCEPTED}, valid against the JSON Schema in the system prompt. Problems:\n"
        f"{listed}\n"
        f"Reply again with the corrected JSON only (retry {retry} of {max_retries})."
    )
