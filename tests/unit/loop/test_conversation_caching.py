"""Conversation caching: the breakpoints the fake Messages API receives, and the cache hit ratio metric."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from agentrun.api.stops import StopReason
from agentrun.loop.events import ModelRequestFinished
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun_sandbox.messages.script import Reply, ScriptUsage, text_block, tool_use_block
from tests.support.loop_harness import FakeTool, LoopRun, run_scripted

EPHEMERAL = {"type": "ephemeral"}


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where the request carries cache_control, as paths (system.0, tools.1, messages.4.content.2)."""
    found: list[str] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if "cache_control" in node:
                assert node["cache_control"] == EPHEMERAL
                found.append(path)
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}.{index}")

    for key in ("tools", "system", "messages"):  # the order of the cached prefix
        walk(body.get(key), key)
    return found


def _calls(count: int, turn: int) -> Reply:
    return Reply([tool_use_block("t", {"q": f"{turn}-{i}"}, id=f"toolu_{turn}_{i}") for i in range(count)])


async def test_without_system_prompt_or_tools_the_conversation_itself_is_cached() -> None:
    run = await run_scripted([Reply([text_block("done")])])
    assert breakpoints(run.requests[0].body) == ["messages.0.content.0"]


async def test_system_prompt_tools_and_newest_message_carry_one_breakpoint_each_on_the_first_request() -> (
    None
):
    run = await run_scripted(
        [_calls(1, 1), Reply([text_block("done")])],
        tools=[FakeTool("t"), FakeTool("u")],
        spec={"systemPrompt": "be brief"},
    )
    assert breakpoints(run.requests[0].body) == ["tools.1", "system.0", "messages.0.content.0"]


async def test_a_follow_up_request_marks_its_newest_message_and_where_the_previous_request_ended() -> None:
    run = await run_scripted(
        [_calls(2, 1), Reply([text_block("done")])],
        tools=[FakeTool("t")],
        spec={"systemPrompt": "be brief"},
    )
    second = run.requests[1].body
    # messages: 0 task, 1 assistant (two calls), 2 user (two results): the last result of the newest
    # message writes the next cache entry; the task, the previous request's end, reads this one.
    assert breakpoints(second) == ["tools.0", "system.0", "messages.0.content.0", "messages.2.content.1"]
    assert run.outcome.stop_reason is StopReason.END_TURN


async def test_a_long_conversation_never_sends_more_than_four_breakpoints() -> None:
    turns = 12
    run = await run_scripted(
        [*(_calls(3, turn) for turn in range(turns)), Reply([text_block("done")])],
        tools=[FakeTool("t")],
        spec={
            "systemPrompt": "be brief",
            "limits": {"maxIterations": 50, "loopDetection": {"enabled": False}},
        },
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert len(run.requests) == turns + 1
    for number, request in enumerate(run.requests):
        body = request.body
        marks = breakpoints(body)
        assert len(marks) <= 4, marks
        newest = len(body["messages"]) - 1
        expected = ["tools.0", "system.0"]
        if number:
            expected.append(
                f"messages.{newest - 2}.content.{len(body['messages'][newest - 2]['content']) - 1}"
            )
        expected.append(f"messages.{newest}.content.{len(body['messages'][newest]['content']) - 1}")
        assert marks == expected
    # Each request's newest message is where the next request reads from: the same block, marked.
    for earlier, later in zip(run.requests, run.requests[1:], strict=False):
        newest = len(earlier.body["messages"]) - 1
        assert later.body["messages"][newest] == earlier.body["messages"][newest]


async def test_without_a_system_prompt_the_free_breakpoint_is_not_used_twice() -> None:
    run = await run_scripted([_calls(1, 1), _calls(1, 2), Reply([text_block("done")])], tools=[FakeTool("t")])
    assert breakpoints(run.requests[2].body) == ["tools.0", "messages.2.content.0", "messages.4.content.0"]


async def test_breakpoints_go_on_copies_so_the_stored_conversation_never_carries_them() -> None:
    run = await run_scripted([_calls(1, 1), Reply([text_block("done")])], tools=[FakeTool("t")])
    assert "cache_control" not in str(run.recorder.transcript())


async def test_the_cache_hit_ratio_counts_cache_reads_over_every_input_side_token() -> None:
    registry = CollectorRegistry()
    observer = MetricsObserver(Metrics(registry), namespace="team-a", started_monotonic=0.0)
    await run_scripted(
        [
            Reply([tool_use_block("t", {})], usage=ScriptUsage(100, 5, cache_creation_input_tokens=900)),
            Reply([text_block("done")], usage=ScriptUsage(50, 5, cache_read_input_tokens=900)),
        ],
        tools=[FakeTool("t")],
        observers=[observer],
        spec={"model": {"name": "claude-sonnet-4-6"}},
    )
    labels = {"namespace": "team-a", "model": "claude-sonnet-4-6"}
    prompt = registry.get_sample_value("agentrun_prompt_tokens_total", labels)
    cached = registry.get_sample_value("agentrun_prompt_cached_tokens_total", labels)
    assert (prompt, cached) == (100 + 900 + 50 + 900, 900)


def _input_sides(run: LoopRun) -> list[tuple[int, int, int]]:
    """(uncached, cache read, cache written) input tokens of each answered request, in order."""
    return [
        (e.usage.input_tokens, e.usage.cache_read_input_tokens, e.usage.cache_creation_input_tokens)
        for e in run.recorder.of(ModelRequestFinished)
        if e.outcome == "ok"
    ]


async def test_against_a_caching_server_each_request_reads_the_whole_previous_prompt_from_cache() -> None:
    big = FakeTool("t", answer="log line\n" * 600)  # about 1400 tokens per result
    turns = 8
    run = await run_scripted(
        [*(_calls(1, turn) for turn in range(turns)), Reply([text_block("done")])],
        tools=[big],
        spec={"limits": {"maxIterations": 50, "loopDetection": {"enabled": False}}},
        prompt_cache=True,
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    sides = _input_sides(run)
    assert len(sides) == turns + 1
    prompts = [sum(side) for side in sides]
    for number in range(2, len(sides)):
        uncached, read, written = sides[number]
        assert read == prompts[number - 1]  # the history came from cache
        assert uncached == 0 and written == prompts[number] - prompts[number - 1]
    # Full-price input per request stays the size of one turn while the prompt keeps growing.
    assert max(written for _, _, written in sides[2:]) < prompts[1]
    assert prompts[-1] > 5 * prompts[1]


async def test_a_turn_of_more_parallel_calls_than_the_lookback_still_reads_the_history_from_cache() -> None:
    # Results short enough never to be cleared, behind a system prompt long enough to be cached.
    small = FakeTool("t", answer="log line\n" * 100)
    run = await run_scripted(
        [_calls(1, 0), _calls(12, 1), Reply([text_block("done")])],
        tools=[small],
        spec={"systemPrompt": "Be careful. " * 450, "limits": {"loopDetection": {"enabled": False}}},
        prompt_cache=True,
    )
    sides = _input_sides(run)
    assert 0 < sides[1][1] < sum(sides[1])  # the system prompt was read, the conversation written
    assert sides[2][1] == sum(sides[1])  # 24 new blocks: only the second breakpoint finds the entry
