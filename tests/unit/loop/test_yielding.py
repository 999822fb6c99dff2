"""A run asked to yield (its replica hands it over) goes on to its next checkpoint and stops there, so
the replica that resumes it from what was checkpointed asks the model nothing twice."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import anthropic
import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.errors import HandedOff
from agentrun.loop.events import Checkpoint, RunFinished, RunYielded
from agentrun.loop.protocols import ToolCall, ToolOutput
from agentrun.loop.running import run_loop
from agentrun.loop.state import RunState
from agentrun.model.anthropic_calling import AnthropicModel
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.loop_harness import FAST_RETRIES, FakeTool, Recorder

MARKER = "[scenario:yield]"


@dataclass
class YieldingTool(FakeTool):
    """A tool during whose first call the run is asked to yield."""

    yielding: asyncio.Event = field(default_factory=asyncio.Event)

    async def call(self, call: ToolCall) -> ToolOutput:
        self.yielding.set()
        return await super().call(call)


def resumed(recorder: Recorder) -> RunState:
    """The state the next owner rebuilds from what the checkpoints carried."""
    last: Checkpoint = recorder.of(Checkpoint)[-1]
    return RunState.restore(recorder.transcript(), last.state)


async def execute(
    server_url: str,
    tool: FakeTool,
    recorder: Recorder,
    *,
    yielding: asyncio.Event | None,
    state: RunState | None = None,
) -> Outcome:
    spec = AgentRunSpec.model_validate({"task": f"{MARKER} record two steps"})
    client = anthropic.AsyncAnthropic(api_key="sk-test", base_url=server_url, max_retries=0, timeout=30)
    try:
        return await run_loop(
            LoopConfig.from_spec(spec, run_id="run-uid", retry=FAST_RETRIES),
            model=AnthropicModel(client),
            tools={tool.name: tool},
            observer=recorder,
            clock=SystemClock(),
            pricer=PriceTable(),
            cancel=asyncio.Event(),
            state=state,
            yield_at_checkpoint=yielding,
        )
    finally:
        await client.close()


def steps(delay_seconds: float = 0.0) -> Sequence[Reply]:
    return [
        Reply([tool_use_block("record", {"q": "1"}, id="toolu_1")], delay_seconds=delay_seconds),
        Reply([tool_use_block("record", {"q": "2"}, id="toolu_2")], delay_seconds=delay_seconds),
        Reply([text_block("both recorded")]),
    ]


def asked(requests: Sequence[RecordedRequest]) -> list[int]:
    """Each request's position in the conversation: a request asked twice shows the same number twice."""
    return [len(r.body["messages"]) for r in requests]


async def test_a_run_asked_to_yield_mid_request_records_the_answer_and_the_next_owner_asks_on() -> None:
    api = FakeMessagesAPI(scripts=[Script(MARKER, steps(delay_seconds=0.4))], demo_brain=False)
    tool = FakeTool("record")
    yielding = asyncio.Event()
    first = Recorder()
    async with api.running() as server:
        asyncio.get_running_loop().call_later(0.1, yielding.set)  # while the first request is in flight
        with pytest.raises(HandedOff):
            await execute(server.url, tool, first, yielding=yielding)
        # The answer in flight was recorded, tools pending; no tool ran, nothing ended.
        assert len(server.requests) == 1 and tool.calls == []
        assert first.of(Checkpoint)[-1].tools_pending is True
        assert isinstance(first.events[-1], RunYielded) and first.of(RunFinished) == []

        second = Recorder()
        outcome = await execute(server.url, tool, second, yielding=asyncio.Event(), state=resumed(first))
        assert outcome.stop_reason is StopReason.END_TURN and outcome.result == "both recorded"
        assert asked(server.requests) == [1, 3, 5], "a model request was asked twice"
        assert [call.id for call in tool.calls] == ["toolu_1", "toolu_2"]


async def test_a_run_asked_to_yield_during_its_tools_records_their_results_before_it_stops() -> None:
    api = FakeMessagesAPI(scripts=[Script(MARKER, steps())], demo_brain=False)
    yielding = asyncio.Event()
    tool = YieldingTool("record", delay=0.2, yielding=yielding)
    first = Recorder()
    async with api.running() as server:
        with pytest.raises(HandedOff):
            await execute(server.url, tool, first, yielding=yielding)
        assert len(server.requests) == 1 and [call.id for call in tool.calls] == ["toolu_1"]
        results = first.transcript()[-1]
        assert results["role"] == "user" and results["content"][0]["tool_use_id"] == "toolu_1"

        outcome = await execute(server.url, tool, Recorder(), yielding=None, state=resumed(first))
        assert outcome.stop_reason is StopReason.END_TURN
        assert asked(server.requests) == [1, 3, 5]
        assert [call.id for call in tool.calls] == ["toolu_1", "toolu_2"], "a tool call was made twice"


async def test_a_run_never_asked_to_yield_runs_to_its_end() -> None:
    api = FakeMessagesAPI(scripts=[Script(MARKER, steps())], demo_brain=False)
    recorder = Recorder()
    async with api.running() as server:
        outcome = await execute(server.url, FakeTool("record"), recorder, yielding=asyncio.Event())
    assert outcome.stop_reason is StopReason.END_TURN and recorder.of(RunYielded) == []
