"""Properties of the pure loop over generated model behaviours (no SDK: a scripted ModelClient).

The model answers with random mixes of text, tool calls (to known, unknown, failing, crashing,
slow and fatal tools), truncations, every stop reason (and unknown ones), text-written tool
calls and model API errors. Whatever it does, these hold:

- run_loop returns a terminal Outcome and never raises; RunFinished is the last event, once.
- iterations <= maxIterations + 1 (the tools-off final turn).
- every tool_use the loop sends back is answered by exactly one tool_result, ids verbatim, in
  call order, in the user message right after it; no tool runs twice for one id; a call cut
  off by max_tokens never runs; in the stored transcript only the run's very last message may
  hold unanswered calls (the turn the run ended on), and none of those ran.
- the usage in Progress is exactly the sum of the usage of the responses received.
- budgets are checked before each request: no request is sent once usage reached tokenBudget
  (or spend reached costBudgetUSD), so a run ends above a budget by at most its last response.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from agentrun.api.spec import Limits
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.usage import TokenUsage
from agentrun.loop.config import LoopConfig, RetryPolicy
from agentrun.loop.errors import FatalModelError, RetryableModelError, RetryClass, ToolError
from agentrun.loop.events import Checkpoint, RunFinished
from agentrun.loop.protocols import ModelRequest, ModelResponse, ToolCall, ToolDefinition, ToolOutput
from agentrun.loop.running import run_loop
from tests.support.loop_harness import FakeClock, Recorder

PROPERTY_SETTINGS = settings(
    deadline=None,
    max_examples=int(os.environ.get("AGENTRUN_PROPERTY_EXAMPLES", "150")),
    derandomize=os.environ.get("CI", "").lower() == "true",
    suppress_health_check=[HealthCheck.too_slow],
)
TOOL_NAMES = ("alpha", "beta", "gamma")
FINISH, DRIFT = "<<DONE>>", "\nUser:"
MODEL = "scripted-model"


# ---------------------------------------------------------------------------------------------- tools


class ScriptedTool:
    """Does what each call's input says: answer, fail, fail fatally, crash, and sleep first."""

    def __init__(self, name: str, clock: FakeClock, executed: list[str]) -> None:
        self._name = name
        self._clock = clock
        self._executed = executed

    @property
    def definition(self) -> ToolDefinition:
        write_key = "shared" if self._name == "gamma" else None
        return ToolDefinition(self._name, "scripted", {"type": "object"}, write_key=write_key)

    async def call(self, call: ToolCall) -> ToolOutput:
        self._executed.append(call.id)
        action = call.input.get("do", "ok")
        sleep = call.input.get("sleep", 0)
        if isinstance(sleep, int | float) and sleep > 0:
            await self._clock.sleep(float(sleep))
        if action == "fail":
            raise ToolError("bad_input", "scripted failure", hint="try other input")
        if action == "fatal":
            raise ToolError("unauthorized", "scripted fatal failure", recoverable=False)
        if action == "crash":
            raise RuntimeError("scripted crash")
        return ToolOutput(f"{self._name} says {call.input.get('n', 0)}")


# ---------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Turn:
    """One generated model behaviour; `error` replaces the answer with a model API error."""

    text: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    stop: str = "end_turn"
    stop_sequence: str | None = None
    truncate_last_call: bool = False
    usage: TokenUsage = field(default_factory=TokenUsage)
    error: str | None = None


class ScriptedModel:
    """A ModelClient that plays the turns in order, then answers "done" forever."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self._turns = list(turns)
        self.requests: list[ModelRequest] = []
        self.usage_before_request: list[TokenUsage] = []
        self.received = TokenUsage()
        self.truncated_ids: set[str] = set()
        self._ids = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        self.usage_before_request.append(self.received)
        await asyncio.sleep(0)
        turn = self._turns.pop(0) if self._turns else Turn("done", usage=TokenUsage(1, 1))
        if turn.error == "retryable":
            raise RetryableModelError("scripted overload", retry_class=RetryClass.OVERLOADED)
        if turn.error == "fatal":
            raise FatalModelError("scripted bad request", reason="InvalidModelRequest", status=400)
        content: list[dict[str, Any]] = []
        if turn.text:
            content.append({"type": "text", "text": turn.text})
        for index, (name, args) in enumerate(turn.calls):
            self._ids += 1
            block_id = f"toolu_{self._ids:04d}"
            cut = turn.truncate_last_call and index == len(turn.calls) - 1
            if cut:
                self.truncated_ids.add(block_id)
                args = {}  # what the SDK leaves of input cut mid-JSON
            content.append({"type": "tool_use", "id": block_id, "name": name, "input": args})
        self.received = self.received + turn.usage
        return ModelResponse(content, turn.stop, turn.usage, MODEL, stop_sequence=turn.stop_sequence)


class FlatPricer:
    """$1 per thousand tokens of any kind: easy to reason about."""

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        return Decimal(usage.total) / 1000


# ---------------------------------------------------------------------------------------------- strategies

usages = st.builds(
    TokenUsage,
    st.integers(0, 400),
    st.integers(0, 200),
    st.integers(0, 100),
    st.integers(0, 300),
)
call_args = st.fixed_dictionaries(
    {"n": st.integers(0, 3), "do": st.sampled_from([*["ok"] * 6, "fail", "fail", "crash", "fatal"])},
    optional={"sleep": st.sampled_from([0, 1, 5, 40])},
)
calls = st.lists(st.tuples(st.sampled_from([*TOOL_NAMES, "nope"]), call_args), min_size=1, max_size=3)
texts = st.sampled_from(["", "thinking", "The answer is 4.", " "])


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    usage = draw(usages)
    kind = draw(
        st.sampled_from(
            ["tools", "tools", "tools", "truncated_tools", "text", "text_tool_call", "error", "odd_tools"]
        )
    )
    if kind == "tools":
        return Turn(draw(texts), tuple(draw(calls)), "tool_use", usage=usage)
    if kind == "truncated_tools":
        return Turn(draw(texts), tuple(draw(calls)), "max_tokens", truncate_last_call=True, usage=usage)
    if kind == "odd_tools":
        # Calls next to a stop reason that does not run them: answered as not run, never executed.
        stop = draw(st.sampled_from(["refusal", "end_turn", "future_reason", "stop_sequence"]))
        sequence = draw(st.sampled_from([FINISH, DRIFT])) if stop == "stop_sequence" else None
        return Turn(draw(texts), tuple(draw(calls)), stop, sequence, usage=usage)
    if kind == "text_tool_call":
        name = draw(st.sampled_from([*TOOL_NAMES, "nope"]))
        args = draw(call_args)
        return Turn(f"<tool_use>{json.dumps({'name': name, 'input': args})}</tool_use>", usage=usage)
    if kind == "error":
        return Turn(error=draw(st.sampled_from(["retryable", "retryable", "fatal"])))
    stop = draw(
        st.sampled_from(
            ["end_turn", "max_tokens", "pause_turn", "refusal", "stop_sequence", "stop_sequence", "unknown_x"]
        )
    )
    sequence = draw(st.sampled_from([FINISH, DRIFT])) if stop == "stop_sequence" else None
    return Turn(draw(texts), (), stop, sequence, usage=usage)


# Runs of the same turn make repeats likely: loops, repeated cuts, repeated drift.
turn_lists = st.lists(st.tuples(turns(), st.integers(1, 4)), max_size=8).map(
    lambda runs: [turn for turn, times in runs for _ in range(times)]
)

configs = st.fixed_dictionaries(
    {
        "limits": st.builds(
            Limits,
            max_iterations=st.integers(1, 6),
            token_budget=st.one_of(st.none(), st.integers(100, 3000)),
            cost_budget_usd=st.one_of(st.none(), st.decimals("0.1", "3", places=2).map(float)),
            timeout_seconds=st.sampled_from([30, 1000]),
            max_consecutive_tool_errors=st.integers(1, 4),
            tool_concurrency=st.integers(1, 3),
            tool_timeout_seconds=st.just(60),
        ),
        "required_tools": st.sampled_from([(), ("alpha",)]),
    }
)


# ---------------------------------------------------------------------------------------------- checks


def tool_use_ids(message: Mapping[str, Any]) -> list[str]:
    return [b["id"] for b in message["content"] if b.get("type") == "tool_use"]


def result_ids(message: Mapping[str, Any]) -> list[str]:
    return [b["tool_use_id"] for b in message["content"] if b.get("type") == "tool_result"]


def check_history(messages: Sequence[Mapping[str, Any]], *, trailing_allowed: bool) -> set[str]:
    """Every tool_use answered once, verbatim, in order, in the next message; returns answered ids."""
    assert messages[0]["role"] == "user"
    answered: set[str] = set()
    for index, message in enumerate(messages):
        if message["role"] == "user":
            ids = result_ids(message)
            previous = messages[index - 1] if index else None
            expected = tool_use_ids(previous) if previous and previous["role"] == "assistant" else []
            assert ids == expected, f"message {index}: results {ids} do not answer calls {expected}"
            answered.update(ids)
            continue
        ids = tool_use_ids(message)
        if not ids:
            continue
        if index == len(messages) - 1:
            assert trailing_allowed, f"message {index}: calls {ids} sent to the model unanswered"
            continue
        assert messages[index + 1]["role"] == "user", f"message {index}: calls not followed by results"
    return answered


@dataclass(frozen=True)
class Played:
    """One run of the loop against a scripted model, and everything it left behind."""

    config: LoopConfig
    outcome: Outcome
    model: ScriptedModel
    recorder: Recorder
    executed: list[str]


async def play(turns_: Sequence[Turn], config: Mapping[str, Any]) -> Played:
    clock = FakeClock()
    executed: list[str] = []
    tools = {name: ScriptedTool(name, clock, executed) for name in TOOL_NAMES}
    model = ScriptedModel(turns_)
    recorder = Recorder()
    loop_config = LoopConfig(
        run_id="prop",
        task="do the thing",
        model=MODEL,
        max_tokens=100,
        finish_sequences=(FINISH,),
        stop_sequences=(DRIFT,),
        retry=RetryPolicy(max_retries=2, base_seconds=1, max_seconds=4),
        **config,
    )
    outcome = await run_loop(
        loop_config,
        model=model,
        tools=tools,
        observer=recorder,
        clock=clock,
        pricer=FlatPricer(),
        cancel=asyncio.Event(),
    )
    return Played(loop_config, outcome, model, recorder, executed)


@PROPERTY_SETTINGS
@given(turn_lists, configs)
def test_the_loop_keeps_its_invariants_whatever_the_model_does(
    turns_: list[Turn], config: dict[str, Any]
) -> None:
    played = asyncio.run(play(turns_, config))
    loop_config, outcome, model, recorder, executed = (
        played.config,
        played.outcome,
        played.model,
        played.recorder,
        played.executed,
    )

    # A terminal outcome, announced once, last.
    assert isinstance(outcome.stop_reason, StopReason)
    event(f"stopReason {outcome.stop_reason.value}")  # see --hypothesis-show-statistics
    last = recorder.events[-1]
    assert isinstance(last, RunFinished) and len(recorder.of(RunFinished)) == 1
    assert last.outcome == outcome
    progress = last.progress

    # Iterations: bounded by the limit plus the final turn; one per answered request.
    assert progress.iterations <= loop_config.limits.max_iterations + 1
    if outcome.stop_reason is StopReason.MAX_ITERATIONS:
        assert progress.iterations >= loop_config.limits.max_iterations

    # Usage in Progress is exactly what the responses reported.
    assert progress.usage == model.received

    # Budgets are checked before each request.
    for before in model.usage_before_request:
        if loop_config.limits.token_budget is not None:
            assert before.total < loop_config.limits.token_budget
        if loop_config.cost_budget_usd is not None:
            assert Decimal(before.total) / 1000 < loop_config.cost_budget_usd

    # Every request the model saw is a valid conversation.
    for request in model.requests:
        check_history(request.messages, trailing_allowed=False)

    # The stored transcript: the same, except the turn the run ended on.
    transcript: list[dict[str, Any]] = []
    for checkpoint in recorder.of(Checkpoint):
        transcript.extend(checkpoint.new_messages)
    answered = check_history(transcript, trailing_allowed=True)
    assert len(executed) == len(set(executed)), "a tool ran twice for one tool_use id"
    assert not set(executed) & model.truncated_ids, "a call cut off by max_tokens was executed"
    recovered = {i for i in executed if i.startswith("text-")}
    assert set(executed) - recovered <= answered, "a tool ran for a call that was never answered"
    assert progress.tool_calls == len(executed)
