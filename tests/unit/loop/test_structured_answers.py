"""Structured answers (spec.output): the final answer is JSON the schema accepts, or it goes back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import anthropic

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import Phase
from agentrun.api.status_patches import finished
from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.events import Checkpoint
from agentrun.loop.running import run_loop
from agentrun.loop.state import RunState
from agentrun.model.anthropic_calling import AnthropicModel
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, Step, text_block, tool_use_block
from tests.support.loop_harness import FAST_RETRIES, FakeTool, Recorder, run_scripted

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string"},
        "pods": {"type": "integer", "minimum": 0},
    },
    "required": ["summary", "pods"],
    "additionalProperties": False,
}
OUTPUT = {"output": {"schema": SCHEMA}}
VALID = '{"summary": "all healthy", "pods": 3}'


def _answer(text: str, **usage: int) -> Reply:
    return Reply([text_block(text)], usage=ScriptUsage(**usage) if usage else ScriptUsage(10, 5))


def _last_user_text(request: RecordedRequest) -> str:
    return "".join(b.get("text", "") for b in request.body["messages"][-1]["content"])


async def test_a_valid_json_answer_succeeds_with_the_value_in_status_output() -> None:
    run = await run_scripted([_answer(VALID)], spec=OUTPUT)
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.output == {"summary": "all healthy", "pods": 3}
    assert run.outcome.result == VALID
    status = finished(run.outcome, run.finished.progress, now="2026-01-01T00:00:00Z", generation=1).body()
    assert status["phase"] == "Succeeded"
    assert status["output"] == {"summary": "all healthy", "pods": 3}
    assert "outputOmitted" not in status


async def test_the_schema_and_the_accepted_form_are_in_the_system_prompt_after_the_users_own() -> None:
    run = await run_scripted([_answer(VALID)], spec={**OUTPUT, "systemPrompt": "You are an SRE."})
    system = run.requests[0].body["system"]
    text = system if isinstance(system, str) else "".join(b["text"] for b in system)
    assert text.startswith("You are an SRE.")
    assert json.dumps(SCHEMA, indent=2, sort_keys=True) in text
    assert "nothing before or after it" in text and "```json" in text


async def test_an_answer_in_one_json_code_fence_is_accepted_without_the_fence() -> None:
    run = await run_scripted([_answer(f"```json\n{VALID}\n```")], spec=OUTPUT)
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.output == {"summary": "all healthy", "pods": 3}
    assert run.outcome.result == VALID


async def test_prose_around_the_json_is_sent_back_and_the_corrected_answer_succeeds() -> None:
    run = await run_scripted(
        [_answer(f"Here is the report: {VALID} Hope it helps."), _answer(VALID)], spec=OUTPUT
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.output == {"summary": "all healthy", "pods": 3}
    assert len(run.requests) == 2
    note = _last_user_text(run.requests[1])
    assert "not JSON" in note and "nothing before or after it" in note
    assert "retry 1 of 2" in note
    assert run.finished.progress.iterations == 2


async def test_an_answer_failing_the_schema_is_sent_back_naming_each_validation_error() -> None:
    run = await run_scripted([_answer('{"pods": "three", "extra": 1}'), _answer(VALID)], spec=OUTPUT)
    assert run.outcome.stop_reason is StopReason.END_TURN
    note = _last_user_text(run.requests[1])
    assert "at $.pods: 'three' is not of type 'integer'" in note
    assert "'summary' is a required property" in note
    assert "Additional properties are not allowed ('extra' was unexpected)" in note


async def test_an_answer_that_never_matches_ends_invalid_output_after_max_retries() -> None:
    bad = '{"summary": "x", "pods": -1}'
    run = await run_scripted([_answer(bad), _answer(bad), _answer(bad), _answer(VALID)], spec=OUTPUT)
    assert run.outcome.stop_reason is StopReason.INVALID_OUTPUT
    assert len(run.requests) == 3
    assert "after 2 retries" in run.outcome.message
    assert "at $.pods: -1 is less than the minimum of 0" in run.outcome.message
    assert run.outcome.result == bad and run.outcome.output is None
    status = finished(run.outcome, run.finished.progress, now="2026-01-01T00:00:00Z", generation=1).body()
    assert status["phase"] == Phase.FAILED.value and status["stopReason"] == "InvalidOutput"
    assert "output" not in status
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Stalled"] == "InvalidOutput"


async def test_max_retries_zero_ends_at_the_first_invalid_answer() -> None:
    run = await run_scripted(
        [_answer("not json"), _answer(VALID)], spec={"output": {"schema": SCHEMA, "maxRetries": 0}}
    )
    assert run.outcome.stop_reason is StopReason.INVALID_OUTPUT
    assert len(run.requests) == 1
    assert "not JSON: Expecting value at line 1 column 1" in run.outcome.message


async def test_nan_is_not_json_and_is_sent_back() -> None:
    run = await run_scripted(
        [_answer('{"summary": "x", "pods": NaN}'), _answer(VALID)], spec={"output": {"schema": {}}}
    )
    assert "not JSON: NaN is not JSON" in _last_user_text(run.requests[1])
    assert run.outcome.stop_reason is StopReason.END_TURN


async def test_an_empty_answer_ends_invalid_output_at_once_as_the_api_refuses_empty_turns_back() -> None:
    run = await run_scripted([_answer(""), _answer(VALID)], spec=OUTPUT)
    assert run.outcome.stop_reason is StopReason.INVALID_OUTPUT
    assert len(run.requests) == 1
    assert "not JSON: the answer is empty" in run.outcome.message
    assert "empty turn cannot be sent back" in run.outcome.message


async def test_an_answer_with_no_content_is_also_never_sent_back() -> None:
    run = await run_scripted([Reply([]), _answer(VALID)], spec=OUTPUT)
    assert run.outcome.stop_reason is StopReason.INVALID_OUTPUT
    assert len(run.requests) == 1


async def test_any_json_value_a_schema_allows_is_an_output_not_only_objects() -> None:
    run = await run_scripted(
        [_answer('["a", "b"]')], spec={"output": {"schema": {"type": "array", "items": {"type": "string"}}}}
    )
    assert run.outcome.output == ["a", "b"]


async def test_a_retry_counts_toward_the_token_budget_like_any_request() -> None:
    run = await run_scripted(
        [_answer("nope", input_tokens=900, output_tokens=200), _answer(VALID)],
        spec={**OUTPUT, "limits": {"tokenBudget": 1000}},
    )
    assert run.outcome.stop_reason is StopReason.TOKEN_BUDGET_EXCEEDED
    assert len(run.requests) == 1


async def test_a_retry_at_the_iteration_limit_becomes_the_final_tools_off_turn() -> None:
    tool = FakeTool("lookup")
    run = await run_scripted(
        [Reply([tool_use_block("lookup", {"q": "pods"})]), _answer("nope"), _answer("still prose")],
        tools=[tool],
        spec={**OUTPUT, "limits": {"maxIterations": 2}},
    )
    assert run.outcome.stop_reason is StopReason.MAX_ITERATIONS
    assert len(run.requests) == 3
    last = run.requests[-1].body
    assert last["tool_choice"] == {"type": "none"}
    assert "not JSON" in _last_user_text(run.requests[-1]) and "iteration limit" in _last_user_text(
        run.requests[-1]
    )


async def test_a_finish_sequence_answer_is_checked_against_the_schema_too() -> None:
    spec = {**OUTPUT, "model": {"finishSequences": ["<END>"]}}
    run = await run_scripted(
        [
            Reply([text_block("done, see above")], stop_sequence="<END>"),
            Reply([text_block(VALID)], stop_sequence="<END>"),
        ],
        spec=spec,
    )
    assert run.outcome.stop_reason is StopReason.FINISH_SEQUENCE
    assert run.outcome.output == {"summary": "all healthy", "pods": 3}
    assert "not JSON" in _last_user_text(run.requests[1])


async def test_without_a_schema_the_answer_stays_free_text() -> None:
    run = await run_scripted([_answer("Three pods, all healthy.")])
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.result == "Three pods, all healthy." and run.outcome.output is None
    system = run.requests[0].body.get("system")
    assert not system or "JSON Schema" not in json.dumps(system)


async def _run_from(
    state: RunState | None, steps: Sequence[Step], spec: dict[str, Any]
) -> tuple[Outcome, int]:
    """One loop against its own script, from a restored state or from the start."""
    marker = "[scenario:resume]"
    parsed = AgentRunSpec.model_validate({"task": f"{marker} report", **spec})
    api = FakeMessagesAPI(scripts=[Script(marker, steps)], demo_brain=False)
    async with api.running() as server:
        client = anthropic.AsyncAnthropic(api_key="sk-test", base_url=server.url, max_retries=0, timeout=30)
        try:
            outcome = await run_loop(
                LoopConfig.from_spec(parsed, run_id="run-uid", retry=FAST_RETRIES),
                model=AnthropicModel(client),
                tools={},
                observer=Recorder(),
                clock=SystemClock(),
                pricer=PriceTable(),
                cancel=asyncio.Event(),
                state=state,
            )
        finally:
            await client.close()
        return outcome, len(server.requests)


async def test_a_resumed_run_keeps_its_retry_count_and_stops_where_an_uninterrupted_one_would() -> None:
    spec = {"output": {"schema": SCHEMA, "maxRetries": 1}}
    bad = '{"pods": 1}'
    # The first life: one invalid answer, sent back once; its last checkpoint holds the retry turn.
    first = await run_scripted([_answer(bad), _answer(VALID)], spec=spec, marker="[scenario:resume]")
    retried = [c for c in first.recorder.of(Checkpoint) if c.state.get("outputRetries") == 1]
    assert retried, "the retry must be persisted in a checkpoint"
    messages = first.recorder.transcript()[: retried[0].message_count]
    assert messages[-1]["role"] == "user"
    restored = RunState.restore(messages, retried[0].state)
    assert restored.output_retries == 1
    # The second life answers invalid again: no second retry, as in an uninterrupted run.
    resumed, resumed_requests = await _run_from(restored, [_answer(bad), _answer(bad), _answer(VALID)], spec)
    straight, straight_requests = await _run_from(None, [_answer(bad), _answer(bad), _answer(VALID)], spec)
    assert resumed.stop_reason is straight.stop_reason is StopReason.INVALID_OUTPUT
    assert (resumed_requests, straight_requests) == (1, 2)
    assert resumed.message == straight.message
