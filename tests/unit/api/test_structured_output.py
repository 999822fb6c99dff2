"""spec.output at admission, and the structured answer in status and in the transcript."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentrun.api import status_patches
from agentrun.api.crd import crd
from agentrun.api.spec import IMMUTABLE_SPEC_FIELDS, AgentRunSpec
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.api.transcripts import chunk_object, compress, decode_objects, record
from agentrun.api.usage import TokenUsage
from agentrun.controller.agentruns import phases
from agentrun.controller.agentruns.phases import Ending
from agentrun.loop.config import LoopConfig

PROGRESS = Progress(2, 0, TokenUsage(10, 20), Decimal("0.01"), ())
SCHEMA = {"type": "object", "properties": {"pods": {"type": "integer"}}, "required": ["pods"]}


def _admitted(schema: Any, **output: Any) -> AgentRunSpec | Ending:
    return phases.read_spec({"task": "t", "output": {"schema": schema, **output}})


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "banana"}, "not a valid JSON Schema at type"),
        ({"minimum": "zero"}, "not a valid JSON Schema at minimum: 'zero' is not of type 'number'"),
        ({"properties": {"a": {"$ref": "https://example.com/a.json"}}}, "points outside the schema"),
        ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "'#/$defs/missing' points at nothing"),
        ({"$schema": "https://example.com/my-dialect"}, "is not a JSON Schema draft this operator knows"),
        ({"description": "x" * 70_000}, "at most 65536 are allowed"),
    ],
)
def test_a_schema_that_cannot_check_answers_is_an_invalid_spec_naming_the_field(
    schema: dict[str, Any], expected: str
) -> None:
    ending = _admitted(schema)
    assert isinstance(ending, Ending)
    assert ending.outcome.stop_reason is StopReason.INVALID_SPEC
    assert ending.outcome.message.startswith("spec.output.schema: ")
    assert expected in ending.outcome.message


def test_a_schema_that_is_not_an_object_is_an_invalid_spec() -> None:
    ending = _admitted(True)
    assert isinstance(ending, Ending) and "spec.output.schema" in ending.outcome.message


def test_retries_outside_their_bounds_are_an_invalid_spec() -> None:
    ending = _admitted(SCHEMA, maxRetries=11)
    assert isinstance(ending, Ending) and "spec.output.maxRetries" in ending.outcome.message


@pytest.mark.parametrize(
    "schema",
    [
        SCHEMA,
        {"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}},
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"n": {"type": "integer"}},
            "properties": {"a": {"$ref": "#/definitions/n"}},
        },
        {"$ref": "https://json-schema.org/draft/2020-12/schema"},
        {"enum": [{"$ref": "not a reference, only data"}]},
    ],
)
def test_a_self_contained_schema_of_a_known_draft_is_admitted(schema: dict[str, Any]) -> None:
    spec = _admitted(schema)
    assert isinstance(spec, AgentRunSpec) and spec.output is not None
    assert spec.output.json_schema == schema and spec.output.max_retries == 2


def test_the_loop_gets_the_schema_its_retries_and_a_system_prompt_that_shows_it() -> None:
    spec = AgentRunSpec.model_validate(
        {"task": "t", "systemPrompt": "Be brief.", "output": {"schema": SCHEMA, "maxRetries": 4}}
    )
    config = LoopConfig.from_spec(spec, run_id="r")
    assert config.output_schema == SCHEMA and config.max_output_retries == 4
    assert config.system is not None and config.system.startswith("Be brief.\n\n")
    assert '"required": [\n    "pods"\n  ]' in config.system


def test_spec_output_is_immutable_like_the_rest_of_the_spec() -> None:
    assert "output" in IMMUTABLE_SPEC_FIELDS
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    output = spec["properties"]["output"]
    assert {"rule": "self == oldSelf"}.items() <= output["x-kubernetes-validations"][0].items()
    assert output["properties"]["schema"]["x-kubernetes-preserve-unknown-fields"] is True
    assert output["properties"]["maxRetries"]["description"].endswith("Default 2.")


def test_status_output_takes_any_json_value_in_the_crd() -> None:
    status = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    output = status["properties"]["output"]
    assert output["x-kubernetes-preserve-unknown-fields"] is True and "type" not in output


@pytest.mark.parametrize("value", [{"pods": 3, "names": ["a"]}, ["a", "b"], "text", 7, False])
def test_a_finished_status_carries_the_structured_answer_as_json(value: Any) -> None:
    outcome = Outcome(StopReason.END_TURN, "done", result="{}", output=value)
    body = status_patches.finished(outcome, PROGRESS, now="t", generation=1).body()
    assert body["output"] == value and "outputOmitted" not in body


def test_a_structured_answer_too_big_for_status_is_left_out_whole_and_marked() -> None:
    big = {"lines": ["x" * 100] * 400}
    outcome = Outcome(StopReason.END_TURN, "done", result="{...}", output=big)
    body = status_patches.finished(outcome, PROGRESS, now="t", generation=1).body()
    assert "output" not in body and body["outputOmitted"] is True


def test_a_run_without_a_structured_answer_writes_neither_field() -> None:
    body = status_patches.finished(
        Outcome(StopReason.END_TURN, "done", result="hi"), PROGRESS, now="t", generation=1
    )
    assert {"output", "outputOmitted"}.isdisjoint(body.body())


def test_invalid_output_is_a_failure_with_its_own_condition_reason() -> None:
    outcome = Outcome(StopReason.INVALID_OUTPUT, "the answer did not match", result="nope")
    body = status_patches.finished(outcome, PROGRESS, now="t", generation=1).body()
    assert body["phase"] == "Failed" and body["stopReason"] == "InvalidOutput"
    assert {c["type"]: c["reason"] for c in body["conditions"]}["Succeeded"] == "InvalidOutput"


def test_the_transcript_outcome_keeps_the_structured_answer() -> None:
    outcome = Outcome(StopReason.END_TURN, "done", result='{"pods": 3}', output={"pods": 3, "note": None})
    payload = compress(
        record(first=0, messages=[], trace=[], progress={}, state={}, tools_pending=False, outcome=outcome)
    )
    obj = chunk_object(
        "configmap", namespace="ns", run_name="r", run_uid="u", index=0, part=0, parts=1, payload=payload
    )
    decoded = decode_objects([obj])
    assert decoded.outcome == outcome
