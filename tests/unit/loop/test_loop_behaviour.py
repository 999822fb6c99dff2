"""The loop, driven through the real SDK and adapter against the scripted fake Messages API."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from agentrun.api.status_patches import finished
from agentrun.api.stops import StopReason
from agentrun.loop.config import RetryPolicy
from agentrun.loop.errors import ToolError
from agentrun.loop.events import Checkpoint, ModelRetryScheduled
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun_sandbox.messages.script import (
    ConnectionReset,
    HttpError,
    Reply,
    ScriptUsage,
    StreamError,
    TruncatedStream,
    text_block,
    tool_use_block,
)
from tests.support.loop_harness import FakeClock, FakeTool, run_scripted


def _answer(text: str = "done", **usage: int) -> Reply:
    return Reply([text_block(text)], usage=ScriptUsage(**usage) if usage else ScriptUsage(10, 5))


async def test_tool_call_then_answer_succeeds_with_end_turn_and_exact_usage() -> None:
    tool = FakeTool("lookup", answer="42 pods")
    run = await run_scripted(
        [
            Reply(
                [tool_use_block("lookup", {"q": "pods"}, id="toolu_A1")], usage=ScriptUsage(100, 20, 0, 50)
            ),
            _answer("There are 42 pods.", input_tokens=130, output_tokens=10),
        ],
        tools=[tool],
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.result == "There are 42 pods."
    progress = run.finished.progress
    assert progress.iterations == 2 and progress.tool_calls == 1
    assert (progress.usage.input_tokens, progress.usage.output_tokens) == (230, 30)
    assert progress.usage.cache_read_input_tokens == 50
    second = run.requests[1].body["messages"]
    assert second[-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_A1",
                "content": "42 pods",
                "cache_control": {"type": "ephemeral"},  # the newest message is the next cached prefix
            }
        ],
    }
    assert tool.calls[0].idempotency_key == "run-uid:toolu_A1"


async def test_every_tool_use_id_is_answered_once_in_call_order_in_one_message() -> None:
    slow, fast = FakeTool("slow", answer="S", delay=0.2), FakeTool("fast", answer="F")
    run = await run_scripted(
        [
            Reply([tool_use_block("slow", {}, id="toolu_1"), tool_use_block("fast", {}, id="toolu_2")]),
            _answer(),
        ],
        tools=[slow, fast],
    )
    results = run.requests[1].body["messages"][-1]["content"]
    assert [(r["tool_use_id"], r["content"]) for r in results] == [("toolu_1", "S"), ("toolu_2", "F")]


async def test_tool_failure_is_a_structured_error_result_and_the_run_goes_on() -> None:
    broken = FakeTool("broken", error=ToolError("not_found", "no such pod", hint="list pods first"))
    run = await run_scripted([Reply([tool_use_block("broken", {}, id="toolu_x")]), _answer()], tools=[broken])
    result = run.requests[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True
    assert '"code": "not_found"' in result["content"] and '"recoverable": true' in result["content"]
    assert run.outcome.stop_reason is StopReason.END_TURN


async def test_unexpected_tool_exception_hides_the_stack_trace_from_the_model() -> None:
    broken = FakeTool("broken", error=RuntimeError("secret internal detail"))
    run = await run_scripted([Reply([tool_use_block("broken", {}, id="toolu_x")]), _answer()], tools=[broken])
    result = run.requests[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True and "internal_error" in result["content"]
    assert "secret internal detail" not in result["content"] and "Traceback" not in result["content"]


async def test_fatal_tool_error_stops_the_run_after_answering_the_call() -> None:
    broken = FakeTool("deploy", error=ToolError("unauthorized", "token rejected", recoverable=False))
    run = await run_scripted([Reply([tool_use_block("deploy", {}, id="toolu_x")]), _answer()], tools=[broken])
    assert run.outcome.stop_reason is StopReason.FATAL_TOOL_ERROR
    assert len(run.requests) == 1
    assert run.recorder.transcript()[-1]["content"][0]["tool_use_id"] == "toolu_x"


async def test_unknown_tool_gets_an_error_listing_the_available_tools() -> None:
    run = await run_scripted(
        [Reply([tool_use_block("nope", {}, id="toolu_x")]), _answer()], tools=[FakeTool("real")]
    )
    result = run.requests[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True and "available tools: real" in result["content"]


async def test_max_iterations_ends_with_a_tools_off_final_answer_turn() -> None:
    tool = FakeTool("poll")
    steps = [Reply([tool_use_block("poll", {"q": str(i)})]) for i in range(2)]
    run = await run_scripted(
        [*steps, _answer("best effort answer")], tools=[tool], spec={"limits": {"maxIterations": 2}}
    )
    assert run.outcome.stop_reason is StopReason.MAX_ITERATIONS
    assert run.outcome.result == "best effort answer"
    last = run.requests[-1].body
    assert last["tool_choice"] == {"type": "none"}
    assert "iteration limit" in last["messages"][-1]["content"][-1]["text"]
    assert len(run.requests) == 3


async def test_token_budget_is_checked_before_the_next_request() -> None:
    run = await run_scripted(
        [Reply([tool_use_block("t", {})], usage=ScriptUsage(900, 200)), _answer()],
        tools=[FakeTool("t")],
        spec={"limits": {"tokenBudget": 1000}},
    )
    assert run.outcome.stop_reason is StopReason.TOKEN_BUDGET_EXCEEDED
    assert len(run.requests) == 1


async def test_cost_budget_stops_spending_by_the_price_table() -> None:
    run = await run_scripted(
        [Reply([tool_use_block("t", {})], usage=ScriptUsage(100_000, 10_000)), _answer()],
        tools=[FakeTool("t")],
        spec={"model": {"name": "claude-sonnet-4-6"}, "limits": {"costBudgetUSD": 0.2}},
    )
    # 100k input at $3/M + 10k output at $15/M = $0.45 > $0.20
    assert run.outcome.stop_reason is StopReason.COST_BUDGET_EXCEEDED
    assert run.finished.progress.cost_usd is not None and float(run.finished.progress.cost_usd) == 0.45


async def test_cost_budget_with_an_unpriced_model_is_refused_not_guessed() -> None:
    run = await run_scripted(
        [_answer()], spec={"model": {"name": "mystery-model"}, "limits": {"costBudgetUSD": 1}}
    )
    assert run.outcome.stop_reason is StopReason.INVALID_SPEC
    assert "mystery-model" in run.outcome.message
    assert run.requests == []


async def test_truncated_tool_use_is_reissued_not_executed() -> None:
    done, cut = FakeTool("done"), FakeTool("cut")
    run = await run_scripted(
        [
            Reply(
                [
                    tool_use_block("done", {"q": "a"}, id="toolu_ok"),
                    tool_use_block("cut", {"q": "bbbbbb"}, id="toolu_cut"),
                ],
                faults=[TruncatedStream(mode="max_tokens", keep=0.5)],
            ),
            _answer(),
        ],
        tools=[done, cut],
    )
    assert len(done.calls) == 1 and cut.calls == []
    results = {r["tool_use_id"]: r for r in run.requests[1].body["messages"][-1]["content"]}
    assert results["toolu_cut"]["is_error"] is True and "truncated_input" in results["toolu_cut"]["content"]
    assert "is_error" not in results["toolu_ok"]


async def test_text_cut_by_max_tokens_is_continued_and_joined() -> None:
    run = await run_scripted(
        [Reply([text_block("The answer is ")], stop_reason="max_tokens"), _answer("forty-two.")]
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.result == "The answer is forty-two."
    assert "Continue exactly where you left off" in run.requests[1].body["messages"][-1]["content"][0]["text"]


async def test_answer_still_cut_after_bounded_continuations_is_kept_out_of_result() -> None:
    cut = [Reply([text_block(f"part{i} ")], stop_reason="max_tokens") for i in range(4)]
    run = await run_scripted(cut)
    assert run.outcome.stop_reason is StopReason.MAX_TOKENS
    assert run.outcome.result is None
    assert len(run.requests) == 4


async def test_refusal_finishes_without_running_tools() -> None:
    tool = FakeTool("t")
    run = await run_scripted(
        [
            Reply(
                [tool_use_block("t", {})],
                stop_reason="refusal",
                stop_details={"type": "refusal", "category": "cyber"},
            )
        ],
        tools=[tool],
    )
    assert run.outcome.stop_reason is StopReason.REFUSAL
    assert "cyber" in run.outcome.message
    assert tool.calls == []


async def test_finish_sequence_finishes_cleanly_and_other_sequences_reprompt() -> None:
    run = await run_scripted(
        [
            Reply([text_block("drifting")], stop_reason="stop_sequence", stop_sequence="\nUser:"),
            Reply([text_block("final")], stop_reason="stop_sequence", stop_sequence="---END---"),
        ],
        spec={"model": {"stopSequences": ["\nUser:"], "finishSequences": ["---END---"]}},
    )
    assert run.outcome.stop_reason is StopReason.FINISH_SEQUENCE
    assert run.outcome.result == "final"
    assert run.requests[0].body["stop_sequences"] == ["\nUser:", "---END---"]
    assert "discarded" in run.requests[1].body["messages"][-1]["content"][0]["text"]


async def test_pause_turn_sends_the_content_back_and_resumes() -> None:
    run = await run_scripted(
        [Reply([text_block("thinking...")], stop_reason="pause_turn"), _answer("resumed")]
    )
    assert run.outcome.result == "resumed"
    assert run.requests[1].body["messages"][-1]["role"] == "assistant"


async def test_client_tool_calls_in_a_paused_turn_are_run_and_answered() -> None:
    tool = FakeTool("lookup", answer="42 pods")
    run = await run_scripted(
        [
            Reply([tool_use_block("lookup", {"q": "pods"}, id="toolu_paused")], stop_reason="pause_turn"),
            _answer("resumed"),
        ],
        tools=[tool],
    )
    assert run.outcome.result == "resumed"
    answer = run.requests[1].body["messages"][-1]
    assert answer["role"] == "user"
    assert answer["content"][0]["tool_use_id"] == "toolu_paused"
    assert "42 pods" in str(answer["content"][0]["content"])


async def test_context_window_exceeded_is_its_own_stop_reason() -> None:
    run = await run_scripted([Reply([text_block("x")], stop_reason="model_context_window_exceeded")])
    assert run.outcome.stop_reason is StopReason.CONTEXT_WINDOW_EXCEEDED


async def test_empty_answer_is_reported_as_such() -> None:
    run = await run_scripted([Reply([], stop_reason="end_turn")])
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.result is None and "empty answer" in run.outcome.message


async def test_end_turn_before_required_tools_ran_is_not_accepted() -> None:
    deploy = FakeTool("deploy")
    run = await run_scripted(
        [_answer("done early"), Reply([tool_use_block("deploy", {})]), _answer("deployed")],
        tools=[deploy],
        spec={"requiredTools": ["deploy"]},
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.outcome.result == "deployed"
    assert "deploy" in run.requests[1].body["messages"][-1]["content"][0]["text"]
    assert len(deploy.calls) == 1


async def test_required_tools_never_run_end_as_deliverable_unverified() -> None:
    run = await run_scripted(
        [_answer("one"), _answer("two"), _answer("three")],
        tools=[FakeTool("deploy")],
        spec={"requiredTools": ["deploy"]},
    )
    assert run.outcome.stop_reason is StopReason.DELIVERABLE_UNVERIFIED
    assert "deploy" in run.outcome.message
    assert len(run.requests) == 3


async def test_an_empty_answer_before_required_tools_ran_ends_the_run_rather_than_send_it_back() -> None:
    run = await run_scripted(
        [_answer(""), Reply([tool_use_block("deploy", {})]), _answer("deployed")],
        tools=[FakeTool("deploy")],
        spec={"requiredTools": ["deploy"]},
    )
    assert run.outcome.stop_reason is StopReason.DELIVERABLE_UNVERIFIED
    assert "empty and cannot be sent back" in run.outcome.message
    assert len(run.requests) == 1


async def test_loop_detection_stops_identical_calls() -> None:
    tool = FakeTool("poll", answer="same")
    steps = [Reply([tool_use_block("poll", {"q": "x"})]) for _ in range(5)]
    run = await run_scripted([*steps, _answer()], tools=[tool])
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert len(tool.calls) == 3


async def test_same_tool_failing_with_varying_input_is_a_loop() -> None:
    tool = FakeTool("poll", error=ToolError("bad", "nope"))
    steps = [Reply([tool_use_block("poll", {"q": str(i)})]) for i in range(8)]
    run = await run_scripted(
        [*steps, _answer()],
        tools=[tool],
        spec={"limits": {"maxConsecutiveToolErrors": 50, "loopDetection": {"repeats": 10}}},
    )
    assert run.outcome.stop_reason is StopReason.LOOP_DETECTED
    assert len(tool.calls) == 5


async def test_consecutive_tool_error_turns_stop_the_run() -> None:
    tool = FakeTool("poll", error=ToolError("bad", "nope"))
    steps = [Reply([tool_use_block("poll", {"q": str(i)})]) for i in range(5)]
    run = await run_scripted(
        [*steps, _answer()], tools=[tool], spec={"limits": {"maxConsecutiveToolErrors": 2}}
    )
    assert run.outcome.stop_reason is StopReason.TOO_MANY_TOOL_ERRORS
    assert len(tool.calls) == 2


async def test_tool_timeout_is_an_error_the_model_can_act_on() -> None:
    tool = FakeTool("slow", delay=5)
    run = await run_scripted(
        [Reply([tool_use_block("slow", {})]), _answer()],
        tools=[tool],
        spec={"limits": {"toolTimeoutSeconds": 1}},
    )
    result = run.requests[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True and '"code": "timeout"' in result["content"]


async def test_long_tool_results_are_cut_with_a_visible_marker() -> None:
    tool = FakeTool("big", answer="x" * 500)
    run = await run_scripted(
        [Reply([tool_use_block("big", {})]), _answer()],
        tools=[tool],
        spec={"limits": {"maxToolResultChars": 100}},
    )
    content = run.requests[1].body["messages"][-1]["content"][0]["content"]
    assert content.startswith("x" * 100) and "400 more characters cut" in content


async def test_rate_limit_with_retry_after_is_retried_and_counted() -> None:
    run = await run_scripted(
        [Reply([text_block("ok")], faults=[HttpError.rate_limit(retry_after=0.05, times=2)])]
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    retries = run.recorder.of(ModelRetryScheduled)
    assert [r.retry_class for r in retries] == ["rate_limited", "rate_limited"]
    assert all(abs(r.delay_seconds - 0.05) < 1e-6 for r in retries)


async def test_overloaded_error_inside_a_200_stream_is_retried() -> None:
    run = await run_scripted([Reply([text_block("ok")], faults=[StreamError(times=1)])], always_stream=True)
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert [r.retry_class for r in run.recorder.of(ModelRetryScheduled)] == ["overloaded"]


async def test_authentication_error_is_not_retried() -> None:
    run = await run_scripted([HttpError(error_type="authentication_error")])
    assert run.outcome.stop_reason is StopReason.MODEL_ERROR
    assert run.outcome.condition_reason == "AuthenticationFailed"
    assert len(run.requests) == 1 and "sk-test" not in run.outcome.message


async def test_retries_are_bounded() -> None:
    run = await run_scripted([HttpError(error_type="api_error")])
    assert run.outcome.stop_reason is StopReason.MODEL_ERROR
    assert run.outcome.condition_reason == "ModelRetriesExhausted"
    assert len(run.requests) == 4  # first try + 3 retries (FAST_RETRIES)


async def test_cancel_stops_an_in_flight_model_call() -> None:
    cancel = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, cancel.set)
    run = await run_scripted([Reply([text_block("late")], delay_seconds=10)], cancel=cancel)
    assert run.outcome.stop_reason is StopReason.CANCELLED


async def test_run_timeout_cancels_in_flight_tools_and_answers_their_ids() -> None:
    tool = FakeTool("slow", delay=30)
    run = await run_scripted(
        [Reply([tool_use_block("slow", {}, id="toolu_s")]), _answer()],
        tools=[tool],
        spec={"limits": {"timeoutSeconds": 1, "toolTimeoutSeconds": 60}},
    )
    assert run.outcome.stop_reason is StopReason.TIMEOUT
    last = run.recorder.transcript()[-1]
    assert last["content"][0]["tool_use_id"] == "toolu_s" and last["content"][0]["is_error"] is True


async def test_first_turn_tool_choice_is_forced_and_later_turns_are_auto() -> None:
    run = await run_scripted(
        [Reply([tool_use_block("t", {})]), _answer()],
        tools=[FakeTool("t")],
        spec={"toolChoice": {"type": "tool", "name": "t"}},
    )
    assert run.requests[0].body["tool_choice"] == {"type": "tool", "name": "t"}
    assert "tool_choice" not in run.requests[1].body


async def test_tool_call_written_as_text_is_recovered_and_run() -> None:
    tool = FakeTool("lookup", answer="found")
    run = await run_scripted(
        [_answer('<tool_use>{"name": "lookup", "input": {"q": "a"}}</tool_use>'), _answer("final")],
        tools=[tool],
    )
    assert len(tool.calls) == 1
    assert run.outcome.result == "final"
    assert "found" in run.requests[1].body["messages"][-1]["content"][0]["text"]


async def test_system_prompt_and_tools_form_a_cached_prefix() -> None:
    run = await run_scripted(
        [_answer()], tools=[FakeTool("a"), FakeTool("b")], spec={"systemPrompt": "be brief"}
    )
    body = run.requests[0].body
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in body["tools"][0]


def _metrics() -> tuple[CollectorRegistry, MetricsObserver]:
    registry = CollectorRegistry()
    return registry, MetricsObserver(Metrics(registry), namespace="default", started_monotonic=0.0)


def _retries(registry: CollectorRegistry, retry_class: str) -> float:
    return registry.get_sample_value("agentrun_model_retries_total", {"retry_class": retry_class}) or 0.0


async def test_a_stream_cut_before_message_stop_is_retried_as_a_connection_error() -> None:
    registry, metrics = _metrics()
    tool = FakeTool("t")
    run = await run_scripted(
        [
            Reply(
                [tool_use_block("t", {"q": "complete input"}, id="toolu_1")],
                faults=[TruncatedStream(mode="cut", keep=0.5)],
            ),
            _answer("done"),
        ],
        tools=[tool],
        clock=FakeClock(),
        observers=[metrics],
        always_stream=True,
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    # The cut reply was never acted on: the second, complete reply was, with the full input.
    assert [dict(c.input) for c in tool.calls] == [{"q": "complete input"}]
    assert [r.step for r in run.requests] == [0, 0, 1]
    assert [r.retry_class for r in run.recorder.of(ModelRetryScheduled)] == ["connection"]
    assert _retries(registry, "connection") == 1
    assert run.finished.progress.iterations == 2


async def test_tool_calls_sharing_a_write_key_run_one_after_another() -> None:
    journal: list[tuple[str, str]] = []
    tools = [FakeTool(f"w{i}", write_key="repo", journal=journal) for i in range(3)]
    run = await run_scripted(
        [Reply([tool_use_block(t.name, {}, id=f"toolu_{t.name}") for t in tools]), _answer()], tools=tools
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    # Each call ends before the next one starts; the order between them is not promised.
    assert [kind for kind, _ in journal] == ["start", "end"] * 3
    assert all(journal[i][1] == journal[i + 1][1] for i in range(0, 6, 2))


async def test_tool_calls_without_a_write_key_overlap() -> None:
    journal: list[tuple[str, str]] = []
    tools = [FakeTool(f"r{i}", journal=journal) for i in range(3)]
    await run_scripted(
        [Reply([tool_use_block(t.name, {}, id=f"toolu_{t.name}") for t in tools]), _answer()], tools=tools
    )
    # All three started before any of them finished.
    assert [kind for kind, _ in journal[:3]] == ["start"] * 3


async def test_write_keyed_calls_are_serialised_while_others_run_alongside() -> None:
    journal: list[tuple[str, str]] = []
    keyed = [FakeTool(f"w{i}", write_key="db", journal=journal, steps=3) for i in range(2)]
    free = FakeTool("read", journal=journal, steps=20)
    run = await run_scripted(
        [
            Reply([tool_use_block(t.name, {}, id=f"toolu_{t.name}") for t in [*keyed, free]]),
            _answer(),
        ],
        tools=[*keyed, free],
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    keyed_events = [event for event in journal if event[1] != "toolu_read"]
    assert [kind for kind, _ in keyed_events] == ["start", "end", "start", "end"]
    # The unkeyed read started before the keyed calls were done and ended after them.
    assert journal.index(("start", "toolu_read")) < journal.index(keyed_events[-1])
    assert journal[-1] == ("end", "toolu_read")


async def test_an_unknown_stop_reason_finishes_with_the_raw_value_kept() -> None:
    tool = FakeTool("t")
    run = await run_scripted(
        [Reply([text_block("hmm"), tool_use_block("t", {})], unknown_stop_reason="compaction_needed")],
        tools=[tool],
    )
    assert run.outcome.stop_reason is StopReason.UNEXPECTED_STOP_REASON
    assert run.outcome.raw_stop_reason == "compaction_needed"
    assert "compaction_needed" in run.outcome.message
    assert tool.calls == [] and len(run.requests) == 1
    status = finished(run.outcome, run.finished.progress, now="t", generation=None).body()
    assert (status["stopReason"], status["rawStopReason"], status["phase"]) == (
        "UnexpectedStopReason",
        "compaction_needed",
        "Failed",
    )


async def test_every_retry_is_counted_by_class_in_metrics() -> None:
    registry, metrics = _metrics()
    faults = [
        HttpError.rate_limit(retry_after=None),
        HttpError.overloaded(),
        StreamError(),
        ConnectionReset(during="headers"),
        ConnectionReset(during="body"),
        HttpError(error_type="api_error", status=503),
    ]
    run = await run_scripted(
        [Reply([text_block("ok")], faults=faults)],
        retry=RetryPolicy(max_retries=6, base_seconds=1, max_seconds=8),
        clock=FakeClock(),
        observers=[metrics],
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    counts = {c: _retries(registry, c) for c in ("rate_limited", "overloaded", "connection", "server_error")}
    assert counts == {"rate_limited": 1, "overloaded": 2, "connection": 2, "server_error": 1}
    assert len(run.requests) == 7


async def test_calls_next_to_a_rejected_end_turn_are_answered_as_not_run() -> None:
    deploy = FakeTool("deploy")
    run = await run_scripted(
        [
            Reply(
                [text_block("done"), tool_use_block("deploy", {}, id="toolu_early")], stop_reason="end_turn"
            ),
            Reply([tool_use_block("deploy", {}, id="toolu_real")]),
            _answer("deployed"),
        ],
        tools=[deploy],
        spec={"requiredTools": ["deploy"]},
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    follow_up = run.requests[1].body["messages"][-1]["content"]
    assert follow_up[0]["tool_use_id"] == "toolu_early" and follow_up[0]["is_error"] is True
    assert '"code": "not_run"' in follow_up[0]["content"]
    assert "deploy" in follow_up[1]["text"]
    assert [c.id for c in deploy.calls] == ["toolu_real"]


async def test_each_trace_row_says_how_long_the_model_took_to_answer() -> None:
    """The answering attempt's latency lands in the row (the console's timeline is drawn from it)."""
    tool = FakeTool("lookup", answer="ok")
    run = await run_scripted(
        [
            Reply([tool_use_block("lookup", {}, id="toolu_T1")], delay_seconds=0.3),
            Reply([text_block("done")]),
        ],
        tools=[tool],
    )
    rows = [c.trace for c in run.recorder.of(Checkpoint) if c.trace is not None and not c.tools_pending]
    assert [r.iteration for r in rows] == [1, 2]
    assert rows[0].model_seconds is not None and rows[0].model_seconds >= 0.3
    assert rows[1].model_seconds is not None
