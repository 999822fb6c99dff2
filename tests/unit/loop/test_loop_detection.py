"""Loop detection: no progress across tool turns is a loop; equal answers to different calls are not.

Driven through the real SDK and adapter against the scripted fake Messages API, like the other loop
tests; each false alarm the old rule raised is a run that must succeed here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.errors import ToolError
from agentrun.loop.events import Checkpoint, LoopDetected
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.loop.running import run_loop
from agentrun.loop.state import RunState
from agentrun.model.anthropic_calling import AnthropicModel
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, Step, text_block, tool_use_block
from tests.support.loop_harness import FAST_RETRIES, LoopRun, Recorder, run_scripted


@dataclass
class Answering:
    """A tool that answers each call by its input and how many calls came before it."""

    name: str
    answer: Callable[[Mapping[str, Any], int], str] = lambda _input, _count: '{"ok": true}'
    error: Callable[[Mapping[str, Any]], ToolError | None] = lambda _input: None
    calls: list[ToolCall] = field(default_factory=list)

    @property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description=f"test tool {self.name}",
            input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        count = len(self.calls)
        self.calls.append(call)
        error = self.error(call.input)
        if error is not None:
            raise error
        return ToolOutput(self.answer(call.input, count))


def turn(*calls: tuple[str, dict[str, Any]]) -> Reply:
    return Reply([tool_use_block(name, arguments) for name, arguments in calls])


def answer(text: str = "done") -> Reply:
    return Reply([text_block(text)])


def not_found(arguments: Mapping[str, Any]) -> ToolError:
    return ToolError("not_found", "not found", hint="check the name and namespace")


async def test_three_different_webhook_calls_in_one_turn_with_equal_answers_are_not_a_loop() -> None:
    notify = Answering("notify")
    teams = [("notify", {"q": team}) for team in ("payments", "search", "storage")]
    run = await run_scripted([turn(*teams), answer("Three teams notified.")], tools=[notify])
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.result == "Three teams notified."
    assert len(notify.calls) == 3


async def test_three_different_calls_with_equal_answers_in_one_turn_are_not_a_loop_even_at_two_repeats() -> (
    None
):
    notify = Answering("notify")
    teams = [("notify", {"q": team}) for team in ("payments", "search", "storage")]
    run = await run_scripted(
        [turn(*teams), answer()], tools=[notify], spec={"limits": {"loopDetection": {"repeats": 2}}}
    )
    assert run.outcome.stop_reason is StopReason.END_TURN


async def test_pods_with_empty_logs_are_not_a_loop_in_one_turn_or_across_turns() -> None:
    logs = Answering("pod_logs", answer=lambda _input, _count: "")
    steps = [
        turn(*[("pod_logs", {"q": pod}) for pod in ("web-1", "web-2", "web-3")]),
        turn(("pod_logs", {"q": "web-4"})),
        turn(("pod_logs", {"q": "web-5"})),
        answer("No pod logged anything."),
    ]
    run = await run_scripted(steps, tools=[logs])
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert len(logs.calls) == 5


async def test_lookups_that_all_say_not_found_are_not_a_loop() -> None:
    lookup = Answering("lookup", error=not_found)
    steps = [
        turn(*[("lookup", {"q": name}) for name in ("api", "web", "db")]),
        turn(("lookup", {"q": "cache"})),
        turn(("lookup", {"q": "queue"})),
        answer("None of them exists."),
    ]
    run = await run_scripted(steps, tools=[lookup])
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert len(lookup.calls) == 5
    assert not run.recorder.of(LoopDetected)


async def test_equal_results_across_turns_with_different_inputs_are_not_a_loop() -> None:
    search = Answering("search", answer=lambda _input, _count: "no match")
    steps = [*[turn(("search", {"q": f"term-{i}"})) for i in range(6)], answer("Nothing matched.")]
    run = await run_scripted(steps, tools=[search])
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert len(search.calls) == 6


async def test_a_call_made_again_between_turns_that_progress_is_not_a_loop() -> None:
    apply, check = Answering("apply"), Answering("check", answer=lambda _input, _count: "2 pods ready")
    steps = []
    for change in range(4):
        steps += [turn(("apply", {"q": f"change-{change}"})), turn(("check", {"q": "pods"}))]
    run = await run_scripted([*steps, answer()], tools=[apply, check])
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert len(check.calls) == 4


async def test_the_same_call_in_turn_after_turn_is_a_loop_even_when_its_answers_differ() -> None:
    poll = Answering("poll", answer=lambda _input, count: f"attempt {count}: still pending")
    steps = [turn(("poll", {"q": "job-7"})) for _ in range(6)]
    run = await run_scripted([*steps, answer()], tools=[poll])
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert len(poll.calls) == 3
    assert "the same call in 3 iterations in a row" in run.outcome.message
    assert 'poll {"q":"job-7"}' in run.outcome.message
    [event] = run.recorder.of(LoopDetected)
    assert (event.iteration, event.tool_name) == (3, "poll")


async def test_the_same_call_among_other_calls_in_every_turn_is_a_loop_at_the_configured_repeats() -> None:
    poll, fetch = Answering("poll", answer=lambda _input, count: f"#{count}"), Answering("fetch")
    steps = [turn(("poll", {"q": "job"}), ("fetch", {"q": f"page-{i}"})) for i in range(8)]
    run = await run_scripted(
        [*steps, answer()], tools=[poll, fetch], spec={"limits": {"loopDetection": {"repeats": 5}}}
    )
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert len(poll.calls) == 5
    assert 'the same call in 5 iterations in a row: poll {"q":"job"}' in run.outcome.message


async def test_the_same_whole_turn_repeated_is_a_loop_that_names_every_call_of_it() -> None:
    get, logs = Answering("get"), Answering("pod_logs", answer=lambda _input, _count: "OOMKilled")
    steps = [turn(("get", {"q": "deploy/web"}), ("pod_logs", {"q": "web-1"})) for _ in range(6)]
    run = await run_scripted([*steps, answer()], tools=[get, logs])
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert len(get.calls) == 3
    message = run.outcome.message
    assert "the same iteration (every call and result) repeated 3 times in a row" in message
    assert 'get {"q":"deploy/web"}' in message and 'pod_logs {"q":"web-1"}' in message


async def test_a_cycle_of_two_turns_is_a_loop_after_going_round_twice() -> None:
    a, b = ("check", {"q": "web"}), ("restart", {"q": "web"})
    check, restart = Answering("check", answer=lambda _i, _c: "unhealthy"), Answering("restart")
    steps = [turn(a), turn(b)] * 4
    run = await run_scripted([*steps, answer()], tools=[check, restart])
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert (len(check.calls), len(restart.calls)) == (2, 2)
    assert run.outcome.message == (
        "a cycle of 2 iterations repeated over the last 4 iterations: "
        '[check {"q":"web"}] -> [restart {"q":"web"}]'
    )


async def test_a_cycle_of_three_turns_is_a_loop_after_going_round_twice() -> None:
    tools = [Answering(name) for name in ("scale", "wait", "check")]
    cycle = [turn(("scale", {"q": "3"})), turn(("wait", {"q": "30s"})), turn(("check", {"q": "web"}))]
    run = await run_scripted([*cycle * 4, answer()], tools=tools)
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert [len(t.calls) for t in tools] == [2, 2, 2]
    assert "a cycle of 3 iterations repeated over the last 6 iterations" in run.outcome.message
    assert '[scale {"q":"3"}] -> [wait {"q":"30s"}] -> [check {"q":"web"}]' in run.outcome.message


async def test_a_cycle_whose_answers_change_is_progress_not_a_loop() -> None:
    check = Answering("check", answer=lambda _input, count: f"{count * 25}% rolled out")
    wait = Answering("wait")
    steps = [turn(("check", {"q": "web"})), turn(("wait", {"q": "30s"}))] * 3
    run = await run_scripted([*steps, answer("Rolled out.")], tools=[check, wait])
    assert run.outcome.stop_reason is StopReason.END_TURN


async def test_a_cycle_runs_as_many_turns_as_repeats_allows() -> None:
    check, restart = Answering("check"), Answering("restart")
    steps = [turn(("check", {"q": "web"})), turn(("restart", {"q": "web"}))] * 5
    run = await run_scripted(
        [*steps, answer()], tools=[check, restart], spec={"limits": {"loopDetection": {"repeats": 7}}}
    )
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert len(check.calls) + len(restart.calls) == 7
    assert "over the last 7 iterations" in run.outcome.message


async def test_one_tool_failing_in_parallel_calls_counts_one_turn_not_one_per_call() -> None:
    lookup = Answering("lookup", error=not_found)
    steps = [turn(*[("lookup", {"q": f"n{turn_}-{i}"}) for i in range(3)]) for turn_ in range(3)]
    run = await run_scripted(
        [*steps, answer()],
        tools=[lookup],
        spec={"limits": {"maxConsecutiveToolErrors": 50, "loopDetection": {"failuresPerTool": 3}}},
    )
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert len(lookup.calls) == 9
    assert "every call of tool lookup failed in 3 iterations in a row" in run.outcome.message


async def test_loop_detection_switched_off_lets_a_cycle_run_to_the_iteration_limit() -> None:
    check, restart = Answering("check"), Answering("restart")
    steps = [turn(("check", {"q": "web"})), turn(("restart", {"q": "web"}))] * 3
    run = await run_scripted(
        [*steps, answer()],
        tools=[check, restart],
        spec={"limits": {"loopDetection": {"enabled": False}}},
    )
    assert run.outcome.stop_reason is StopReason.END_TURN


# Resume: the counters ride in every checkpoint, so a run restarted anywhere stops where it would have.

CYCLE = [turn(("check", {"q": "web"})), turn(("restart", {"q": "web"}))] * 4
MARKER = "[scenario:cycle]"


async def resume(steps: Sequence[Step], checkpoints: Sequence[Checkpoint]) -> tuple[Outcome, int]:
    """Run again from the last of `checkpoints`, as the operator does after a restart."""
    messages = [m for c in checkpoints for m in c.new_messages]
    state = RunState.restore(messages, checkpoints[-1].state)
    tools = [Answering("check"), Answering("restart")]
    spec = AgentRunSpec.model_validate({"task": f"{MARKER} fix web"})
    api = FakeMessagesAPI(scripts=[Script(MARKER, steps)], demo_brain=False)
    async with api.running() as server:
        client = anthropic.AsyncAnthropic(api_key="sk-test", base_url=server.url, max_retries=0)
        try:
            outcome = await run_loop(
                LoopConfig.from_spec(spec, run_id="run-uid", retry=FAST_RETRIES),
                model=AnthropicModel(client),
                tools={t.name: t for t in tools},
                observer=Recorder(),
                clock=SystemClock(),
                pricer=PriceTable(),
                cancel=asyncio.Event(),
                state=state,
            )
        finally:
            await client.close()
    return outcome, sum(len(t.calls) for t in tools)


async def uninterrupted() -> LoopRun:
    tools = [Answering("check"), Answering("restart")]
    return await run_scripted([*CYCLE, answer()], tools=tools, marker=MARKER)


async def test_a_run_resumed_after_any_tool_turn_stops_at_the_same_turn_with_the_same_message() -> None:
    whole = await uninterrupted()
    assert whole.outcome.stop_reason is StopReason.LOOP_DETECTED
    checkpoints = whole.recorder.of(Checkpoint)
    after_tools = [i for i, c in enumerate(checkpoints) if c.trace is not None and not c.tools_pending]
    assert len(after_tools) == 4
    for done, index in enumerate(after_tools[:-1], start=1):
        outcome, calls = await resume([*CYCLE, answer()], checkpoints[: index + 1])
        assert (outcome.stop_reason, outcome.message) == (whole.outcome.stop_reason, whole.outcome.message)
        assert calls == 4 - done, f"resumed after tool turn {done}"


async def test_a_run_resumed_after_the_turn_that_decided_the_stop_stops_there_without_asking_again() -> None:
    whole = await uninterrupted()
    checkpoints = whole.recorder.of(Checkpoint)
    last_turn = max(i for i, c in enumerate(checkpoints) if c.trace is not None and not c.tools_pending)
    outcome, calls = await resume([*CYCLE, answer()], checkpoints[: last_turn + 1])
    assert (outcome.stop_reason, outcome.message) == (whole.outcome.stop_reason, whole.outcome.message)
    assert calls == 0, "the operator died after the verdict's checkpoint: no further tool turn"


async def test_a_run_resumed_with_its_tools_in_flight_reruns_them_and_stops_at_the_same_turn() -> None:
    whole = await uninterrupted()
    checkpoints = whole.recorder.of(Checkpoint)
    pending = [i for i, c in enumerate(checkpoints) if c.tools_pending]
    outcome, calls = await resume([*CYCLE, answer()], checkpoints[: pending[-1] + 1])
    assert (outcome.stop_reason, outcome.message) == (whole.outcome.stop_reason, whole.outcome.message)
    assert calls == 1


async def test_the_loop_counters_in_a_checkpoint_stay_small_however_long_the_run() -> None:
    fetch = Answering("fetch", answer=lambda arguments, _count: f"page {arguments['q']} " * 50)
    steps = [turn(*[("fetch", {"q": f"{i}-{part}-" + "x" * 200}) for part in range(5)]) for i in range(40)]
    run = await run_scripted([*steps, answer()], tools=[fetch], spec={"limits": {"maxIterations": 50}})
    assert run.outcome.stop_reason is StopReason.END_TURN and len(fetch.calls) == 200
    sizes = [len(json.dumps(c.state["loopWatch"])) for c in run.recorder.of(Checkpoint)]
    assert max(sizes) < 2000
    assert max(sizes[-20:]) <= max(sizes[:20]) + 100
