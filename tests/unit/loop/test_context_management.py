"""Context management: old tool results cleared and older turns compacted in what is sent, never stored."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from agentrun.api.stops import StopReason
from agentrun.api.usage import TokenUsage
from agentrun.loop.config import ContextConfig
from agentrun.loop.errors import ToolError
from agentrun.loop.events import Checkpoint, ContextCompacted, Event, ModelRequestFinished, RunFinished
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.loop.state import Compaction, RunState
from agentrun.loop.windowing import SUMMARY_REQUEST, chars_of, sent_messages, view_chars
from agentrun_sandbox.messages.recording import RecordedRequest
from agentrun_sandbox.messages.script import Reply, ScriptUsage, text_block, tool_use_block
from agentrun_sandbox.messages.wire import estimate_input_tokens
from tests.support.loop_harness import run_scripted

WINDOW = 20_000
BIG = 12_000  # characters per result: about 3,000 tokens, so seven results fill the window


@dataclass
class LogTool:
    """Answers every call with a distinct large text (a pod log), or fails on the inputs in `failing`."""

    name: str = "pod_logs"
    size: int = BIG
    failing: frozenset[str] = frozenset()
    calls: list[ToolCall] = field(default_factory=list)

    @property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(self.name, "read a pod's log", {"type": "object"})

    async def call(self, call: ToolCall) -> ToolOutput:
        self.calls.append(call)
        pod = str(call.input.get("pod"))
        if pod in self.failing:
            raise ToolError("not_found", f"pod {pod} not found")
        return ToolOutput(f"log of {pod}: " + "line\n" * (self.size // 5))


def _turns(count: int, tool: str = "pod_logs") -> list[Reply]:
    return [Reply([tool_use_block(tool, {"pod": f"p{i}"})]) for i in range(count)]


def _answer() -> Reply:
    return Reply([text_block("all pods checked")], usage=ScriptUsage(None, 5))


def _summary_requests(requests: list[RecordedRequest]) -> list[RecordedRequest]:
    return [r for r in requests if _last_text(r.body).startswith(SUMMARY_REQUEST)]


def _last_text(body: dict[str, Any]) -> str:
    texts = [b.get("text", "") for b in body["messages"][-1]["content"] if b.get("type") == "text"]
    return str(texts[-1]) if texts else ""


def _small_window(**context: Any) -> dict[str, Any]:
    return {"context": {"contextWindowTokens": WINDOW, **context}, "limits": {"maxIterations": 50}}


def _assert_calls_and_results_paired(messages: list[dict[str, Any]]) -> None:
    """Every tool_result answers a tool_use of the message right before it, and every tool_use of
    an assistant message that is not the last one is answered in the message right after it."""
    for index, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if results:
            assert index > 0 and messages[index - 1]["role"] == "assistant"
            calls = {b["id"] for b in messages[index - 1]["content"] if b.get("type") == "tool_use"}
            assert results == calls, f"message {index}: results {results} for calls {calls}"
        if message["role"] == "assistant" and index + 1 < len(messages):
            calls = {b["id"] for b in blocks if b.get("type") == "tool_use"}
            following = messages[index + 1]["content"]
            answered = {b["tool_use_id"] for b in following if b.get("type") == "tool_result"}
            assert calls <= answered, f"message {index}: calls {calls - answered} left unanswered"


async def test_a_run_whose_tool_results_overflow_the_window_compacts_and_succeeds() -> None:
    tool = LogTool()
    run = await run_scripted(
        [*_turns(12), _answer()], tools=[tool], spec=_small_window(), context_window=WINDOW
    )
    assert run.outcome.stop_reason is StopReason.END_TURN, run.outcome.message
    compactions = run.recorder.of(ContextCompacted)
    assert compactions and all(c.tokens_after < c.tokens_before for c in compactions)
    assert len(tool.calls) == 12
    assert all(estimate_input_tokens(r.body) <= WINDOW for r in run.requests)
    # The stored conversation holds every result whole; only what was sent was cut.
    stored = run.recorder.transcript()
    results = [b for m in stored for b in m["content"] if b.get("type") == "tool_result"]
    assert len(results) == 12 and all(len(b["content"]) >= BIG for b in results)


async def test_the_same_run_without_context_management_ends_context_window_exceeded_saying_so() -> None:
    run = await run_scripted(
        [*_turns(12), _answer()],
        tools=[LogTool()],
        spec=_small_window(clearToolResults={"enabled": False}, compaction={"enabled": False}),
        context_window=WINDOW,
    )
    assert run.outcome.stop_reason is StopReason.CONTEXT_WINDOW_EXCEEDED
    assert "prompt is too long" in run.outcome.message
    assert "compaction is off" in run.outcome.message


async def test_clearing_keeps_failed_results_and_the_newest_ones_and_stores_everything() -> None:
    tool = LogTool(size=2_000, failing=frozenset({"p1"}))
    run = await run_scripted(
        [*_turns(6), _answer()],
        tools=[tool],
        spec={"context": {"clearToolResults": {"keepNewest": 2, "minChars": 100, "batch": 1}}},
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    sent = run.requests[-1].body["messages"]
    results = [b for m in sent for b in m["content"] if b.get("type") == "tool_result"]
    assert len(results) == 6
    failed, cleared, kept = results[1], [results[i] for i in (0, 2, 3)], results[4:]
    assert failed.get("is_error") is True and "not found" in failed["content"]
    for block in cleared:
        assert block["content"].startswith("[cleared to save context: the result of pod_logs (call ")
        assert block["tool_use_id"] in block["content"] and "Call pod_logs again" in block["content"]
    assert all(b["content"].startswith("log of p") for b in kept)
    stored = [b for m in run.recorder.transcript() for b in m["content"] if b.get("type") == "tool_result"]
    assert [b["content"].startswith("log of p") for b in stored] == [True, False, True, True, True, True]
    assert not run.recorder.of(ContextCompacted)


async def test_results_are_cleared_in_batches_so_the_sent_prefix_changes_only_every_few_turns() -> None:
    run = await run_scripted(
        [*_turns(12), _answer()],
        tools=[LogTool(size=2_000)],
        spec={"context": {"clearToolResults": {"keepNewest": 2, "batch": 3}}},
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    cleared_per_request = []
    for request in run.requests:
        results = [
            b for m in request.body["messages"] for b in m["content"] if b.get("type") == "tool_result"
        ]
        cleared = [b for b in results if b["content"].startswith("[cleared to save context")]
        assert results[: len(cleared)] == cleared  # the oldest ones
        assert 2 <= len(results) - len(cleared) <= 4 or len(results) < 2
        cleared_per_request.append(len(cleared))
    assert cleared_per_request == [0, 0, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9, 9]


async def test_small_results_are_never_cleared() -> None:
    run = await run_scripted(
        [*_turns(4), _answer()],
        tools=[LogTool(size=50)],
        spec={"context": {"clearToolResults": {"keepNewest": 1}}},
    )
    sent = run.requests[-1].body["messages"]
    results = [b for m in sent for b in m["content"] if b.get("type") == "tool_result"]
    assert all(b["content"].startswith("log of p") for b in results)


async def test_no_tool_use_is_ever_sent_without_its_result_whatever_the_settings() -> None:
    settings = itertools.product((1, 2, 3), (50, 80), (False, True), (1, 2))
    compacted = 0
    for keep_turns, threshold, clearing, calls_per_turn in settings:
        steps = [
            Reply([tool_use_block("pod_logs", {"pod": f"p{i}-{c}"}) for c in range(calls_per_turn)])
            for i in range(14)
        ]
        run = await run_scripted(
            [*steps, _answer()],
            tools=[LogTool(size=6_000 // calls_per_turn)],
            spec=_small_window(
                compaction={"keepNewestTurns": keep_turns, "thresholdPercent": threshold},
                clearToolResults={"enabled": clearing, "keepNewest": 3},
            ),
            context_window=WINDOW,
        )
        case = (keep_turns, threshold, clearing, calls_per_turn)
        assert run.outcome.stop_reason is StopReason.END_TURN, (case, run.outcome.message)
        compacted += bool(run.recorder.of(ContextCompacted))
        for request in run.requests:
            _assert_calls_and_results_paired(request.body["messages"])
            assert request.body["messages"][0]["role"] == "user"
    assert compacted >= 12  # at least every case without clearing compacted


async def test_the_summary_request_has_tools_off_and_counts_in_usage_but_not_in_iterations() -> None:
    run = await run_scripted(
        [*_turns(12), _answer()], tools=[LogTool()], spec=_small_window(), context_window=WINDOW
    )
    summaries = _summary_requests(run.requests)
    compactions = run.recorder.of(ContextCompacted)
    assert summaries and len(summaries) == len(compactions)
    for request in summaries:
        assert request.body["tool_choice"] == {"type": "none"}
        assert "thinking" not in request.body
        _assert_calls_and_results_paired(request.body["messages"])
    progress = run.finished.progress
    assert progress.iterations == 13
    ok = [e for e in run.recorder.of(ModelRequestFinished) if e.outcome == "ok"]
    assert len(ok) == 13 + len(compactions)
    total = sum((e.usage for e in ok), TokenUsage())
    assert progress.usage == total
    assert sum(c.usage.total for c in compactions) > 0


async def test_a_token_budget_spent_by_a_summary_request_stops_the_run_before_the_next_request() -> None:
    probe = await run_scripted(
        [*_turns(12), _answer()], tools=[LogTool()], spec=_small_window(), context_window=WINDOW
    )
    first = probe.recorder.of(ContextCompacted)[0]
    before = probe.recorder.events[: probe.recorder.events.index(first)]
    # Everything spent up to and including the first summary request: the summary's tokens reach it.
    spent = sum((e.usage for e in before if _ok(e)), TokenUsage())
    assert spent.total > sum((e.usage for e in before[:-1] if _ok(e)), TokenUsage()).total
    spec = _small_window()
    spec["limits"]["tokenBudget"] = spent.total
    run = await run_scripted([*_turns(12), _answer()], tools=[LogTool()], spec=spec, context_window=WINDOW)
    assert run.outcome.stop_reason is StopReason.TOKEN_BUDGET_EXCEEDED
    assert len(run.recorder.of(ContextCompacted)) == 1
    # No request went out after the summary had spent the budget.
    assert _summary_requests(run.requests)[-1] is run.requests[-1]


def _ok(event: Event) -> bool:
    return isinstance(event, ModelRequestFinished) and event.outcome == "ok"


class StopAfterCompaction:
    """Cancels the run at its first compaction, keeping the checkpoints as a store would."""

    def __init__(self, cancel: asyncio.Event) -> None:
        self.cancel = cancel
        self.messages: list[dict[str, Any]] = []
        self.snapshot: dict[str, Any] = {}
        self.durable_after_compaction = False

    async def notify(self, event: Event) -> None:
        match event:
            case Checkpoint():
                self.messages.extend(event.new_messages)
                self.snapshot = dict(event.state)
                if self.cancel.is_set() and event.durable:
                    self.durable_after_compaction = True
            case ContextCompacted():
                self.cancel.set()
            case _:
                pass


async def test_a_run_resumed_after_a_compaction_sends_no_second_summary_request() -> None:
    steps = [*_turns(12), _answer()]
    cancel = asyncio.Event()
    keeper = StopAfterCompaction(cancel)
    first = await run_scripted(
        steps,
        tools=[LogTool()],
        spec=_small_window(),
        context_window=WINDOW,
        cancel=cancel,
        observers=[keeper],
    )
    assert first.outcome.stop_reason is StopReason.CANCELLED
    assert keeper.durable_after_compaction
    assert len(_summary_requests(first.requests)) == 1
    stored = json.loads(json.dumps(keeper.snapshot))  # as it comes back from the transcript
    state = RunState.restore(keeper.messages, stored)
    assert state.compaction is not None and state.compactions == 1
    turns = state.compaction.turns
    second = await run_scripted(
        steps, tools=[LogTool()], spec=_small_window(), context_window=WINDOW, state=state
    )
    assert second.outcome.stop_reason is StopReason.END_TURN, second.outcome.message
    resumed_first = second.requests[0].body["messages"]
    assert '<summary turns="' in resumed_first[0]["content"][-1]["text"]
    assert first.recorder.of(ContextCompacted)[0].turns == turns
    assert f'<summary turns="{turns}">' in resumed_first[0]["content"][-1]["text"]
    # Later compactions may come as the run grows again, but never the same one twice.
    later = second.recorder.of(ContextCompacted)
    assert all(c.compactions > 1 for c in later)
    summarized = [_last_text(r.body) for r in _summary_requests(second.requests)]
    assert len(summarized) == len(later)
    assert isinstance(second.finished, RunFinished)


async def test_a_request_the_api_refuses_as_too_long_below_the_threshold_compacts_and_goes_again() -> None:
    # The run believes in a window twice the server's: its threshold is never reached first.
    run = await run_scripted(
        [*_turns(8), _answer()],
        tools=[LogTool()],
        spec=_small_window(contextWindowTokens=2 * WINDOW, compaction={"thresholdPercent": 95}),
        context_window=WINDOW,
    )
    assert run.outcome.stop_reason is StopReason.END_TURN, run.outcome.message
    refused = [r for r in run.requests if r.outcome == "http_error"]
    compactions = run.recorder.of(ContextCompacted)
    assert refused and all(c.refused for c in compactions[: len(refused)])
    assert run.finished.progress.iterations == 9


async def test_an_overflow_with_nothing_left_to_summarize_says_management_could_not_make_room() -> None:
    run = await run_scripted(
        [Reply([tool_use_block("pod_logs", {"pod": "huge"})]), _answer()],
        tools=[LogTool(size=120_000)],
        spec={**_small_window(), "limits": {"maxToolResultChars": 200_000}},
        context_window=WINDOW,
    )
    assert run.outcome.stop_reason is StopReason.CONTEXT_WINDOW_EXCEEDED
    assert "prompt is too long: " in run.outcome.message
    assert "context management could not make room: the next request is too long and no turn" in (
        run.outcome.message
    )


def test_a_size_counts_the_characters_of_compact_json_not_its_bytes() -> None:
    value = [{"role": "user", "content": "ünïcode ✓"}, {"n": 2**70, 1: None}]
    assert chars_of(value) == len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    assert chars_of("ü") == 3  # two bytes in UTF-8


def test_the_view_size_counted_message_by_message_equals_one_serialisation_of_the_whole_view() -> None:
    """Stored messages are measured once per run; the sum must still be exactly the request's size."""
    state = RunState.fresh("ünïcode task")
    for turn in range(12):
        call_id = f"toolu_{turn}"
        state.messages.append(
            {"role": "assistant", "content": [tool_use_block("pod_logs", {"pod": f"p{turn}"}, id=call_id)]}
        )
        result = {"type": "tool_result", "tool_use_id": call_id, "content": "log line\n" * (200 * turn)}
        if turn % 4 == 3:
            result["is_error"] = True
        state.messages.append({"role": "user", "content": [result]})
    configs = [
        ContextConfig(),
        ContextConfig(clear_tool_results=True, keep_tool_results=2, clear_batch=1, clear_min_chars=10),
        ContextConfig(clear_tool_results=True, keep_tool_results=3, clear_batch=4, clear_min_chars=0),
    ]
    for compaction in (None, Compaction("what was done", 9, 4, 900, 300, 5)):
        state.compaction = compaction
        for cfg in configs:
            for _ in range(2):  # the second time from the measured sizes
                view = sent_messages(state, cfg)
                assert view_chars(state, view) == chars_of(list(view))
    assert view_chars(state, []) == chars_of([])
    assert state.measured, "stored messages are measured once and kept"
    assert all(entry[0] in state.messages for entry in state.measured.values())


def _cleared_ids(body: dict[str, Any]) -> set[str]:
    return {
        str(b["tool_use_id"])
        for m in body["messages"]
        for b in m["content"]
        if b.get("type") == "tool_result" and str(b.get("content", "")).startswith("[cleared to save context")
    }


async def test_a_summary_request_sends_the_view_of_the_request_before_it_with_its_results_still_cleared() -> (
    None
):
    """As issue #29 found it: keepNewest 4 in batches of 2, compaction at 60% keeping 2 turns, results of
    9,000 characters. The request before each summary request clears the oldest results; the summary
    request is that request's view up to the cut, cleared results and all, plus the instruction."""
    # 60% of it is reached once a request holds 5 whole results and 2 cleared ones (request 6): the
    # request before the summary is the first to clear (results 0 and 1).
    window = 25_000
    spec = {
        "context": {
            "contextWindowTokens": window,
            "clearToolResults": {"keepNewest": 4, "batch": 2},
            "compaction": {"thresholdPercent": 60, "keepNewestTurns": 2},
        },
        "limits": {"maxIterations": 50},
    }
    run = await run_scripted(
        [*_turns(16), _answer()], tools=[LogTool(size=9_000)], spec=spec, context_window=window
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    summaries = _summary_requests(run.requests)
    assert len(summaries) >= 2
    for summary in summaries:
        before = run.requests[run.requests.index(summary) - 1]
        assert before.outcome == "reply" and not _summary_requests([before])
        sent, seen = _unmarked(summary.body["messages"]), _unmarked(before.body["messages"])
        assert _cleared_ids(before.body), "the request before the summary had cleared results"
        # Cleared results stay cleared: nothing the model last saw as a marker is sent whole again.
        assert _cleared_ids(before.body) & _result_ids(summary.body) <= _cleared_ids(summary.body)
        # Exactly that view up to the cut (but for the cache breakpoints); the instruction joins its
        # last message.
        assert sent[:-1] == seen[: len(sent) - 1]
        assert {**sent[-1], "content": sent[-1]["content"][:-1]} == seen[len(sent) - 1]
        assert estimate_input_tokens(summary.body) < estimate_input_tokens(before.body)


def _result_ids(body: dict[str, Any]) -> set[str]:
    return {
        str(b["tool_use_id"])
        for m in body["messages"]
        for b in m["content"]
        if b.get("type") == "tool_result"
    }


def _unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without the cache breakpoints the model adapter puts on the newest ones."""
    return [
        {
            **m,
            "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]],
        }
        for m in messages
    ]
