"""Rebuilding a run's loop state from what its transcript stored."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress, TraceRow
from agentrun.api.transcripts import Transcript
from agentrun.api.usage import TokenUsage
from agentrun.controller.agentruns.resuming import resume_point_of
from agentrun.loop.state import MAX_CYCLE, LoopWatch, RunState


def busy_state() -> RunState:
    state = RunState.fresh("the task")
    state.messages.append(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}}]}
    )
    state.iterations = 4
    state.tool_calls = 7
    state.add_usage("claude-haiku-4-5", TokenUsage(100, 20, 30, 40))
    state.add_usage("claude-sonnet-4-6", TokenUsage(1, 2, 3, 4))
    state.consecutive_error_turns = 2
    state.continuations = 1
    state.reissues = 1
    state.drift_reprompts = 1
    state.deliverable_nudges = 1
    state.text_parts = ["partial "]
    state.succeeded_tools = {"calc", "search"}
    state.loop_watch = LoopWatch(
        call_streaks={("calc", "h1"): 2, ("search", "h2"): 1},
        turns=[(f"t{i}", f'calc {{"q":"{i}"}}') for i in range(MAX_CYCLE)],
        cycle_runs=[0, 3, 1, 0],
        failure_streaks={"search": 2},
    )
    state.in_flight = TraceRow(4, "tool_use", (), TokenUsage(9, 8, 7, 6), "claude-haiku-4-5", "req_1")
    return state


def test_a_restored_state_has_the_counters_usage_and_in_flight_row_of_the_snapshot() -> None:
    state = busy_state()
    restored = RunState.restore(state.messages, state.snapshot())
    assert restored.messages == state.messages and restored.persisted == len(state.messages)
    assert restored.usage_by_model == state.usage_by_model
    assert restored.usage == TokenUsage(101, 22, 33, 44)
    for name in (
        "iterations",
        "tool_calls",
        "consecutive_error_turns",
        "continuations",
        "reissues",
        "drift_reprompts",
        "deliverable_nudges",
        "text_parts",
        "succeeded_tools",
        "loop_watch",
        "in_flight",
    ):
        assert getattr(restored, name) == getattr(state, name), name
    assert restored.pending_tool_uses() == state.pending_tool_uses()


def test_a_snapshot_survives_json_and_stays_small() -> None:
    import json

    snapshot = busy_state().snapshot()
    assert json.loads(json.dumps(snapshot)) == snapshot
    assert len(json.dumps(snapshot)) < 1500


def test_a_run_without_a_transcript_starts_from_the_task_with_its_elapsed_time() -> None:
    now = dt.datetime(2025, 6, 1, 12, 0, 10, tzinfo=dt.UTC)
    point = resume_point_of(None, "2025-06-01T12:00:00Z", now)
    assert point.state is None and point.outcome is None and point.elapsed_before == 10.0


def test_a_transcript_with_an_outcome_finishes_the_run_with_its_progress() -> None:
    state = busy_state()
    progress = Progress(4, 7, state.usage, Decimal("0.5"))
    transcript = Transcript(
        messages=state.messages,
        progress=progress,
        state=state.snapshot(),
        outcome=Outcome(StopReason.END_TURN, "done", result="42"),
        records=3,
    )
    point = resume_point_of(transcript, "2025-06-01T12:00:00Z", dt.datetime(2025, 6, 1, 12, 1, tzinfo=dt.UTC))
    assert point.outcome == Outcome(StopReason.END_TURN, "done", result="42")
    assert point.progress == progress
    assert point.state is not None and point.state.iterations == 4 and point.elapsed_before == 60.0
