"""The console's HTML: what comes from the API server is text, never markup."""

from __future__ import annotations

from decimal import Decimal

from agentrun.api.traces import Progress, TokenUsage, ToolTrace, TraceRow
from agentrun.api.transcripts import Transcript
from agentrun.console import run_views, views
from agentrun.console.identities import Identity

HOSTILE = '<script>alert("x")</script>'


def hostile_run() -> dict[str, object]:
    return {
        "metadata": {
            "name": "r",
            "namespace": "ns",
            "uid": "u1",
            "creationTimestamp": "2026-11-28T00:00:00Z",
        },
        "spec": {"agentRef": {"name": HOSTILE}},
        "status": {
            "phase": "AwaitingApproval",
            "message": HOSTILE,
            "stopReason": HOSTILE,
            "pendingApprovals": [
                {"toolUseId": "t1", "toolName": HOSTILE, "input": {"x": HOSTILE}, "since": "now"}
            ],
        },
    }


def test_text_from_a_run_is_escaped_in_every_view() -> None:
    run = hostile_run()
    stored = Transcript(
        messages=[
            {"role": "user", "content": HOSTILE},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": HOSTILE, "input": {}}],
            },
        ],
        records=1,
    )
    rendered = views.run_row(run) + run_views.run_page_body(run, stored, "csrf-token")
    assert "<script>" not in rendered
    assert "&lt;script&gt;" in rendered


def test_every_decision_form_carries_the_sessions_csrf_token() -> None:
    rendered = run_views.approvals(hostile_run(), "the-token")
    assert rendered.count('name="csrf" value="the-token"') == 1
    assert 'value="approve"' in rendered and 'value="deny"' in rendered


def test_large_tool_results_are_folded_with_their_size_and_errors_marked() -> None:
    big = "x" * (run_views.FOLD_CHARS + 1)
    stored = Transcript(
        messages=[
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "fetch", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": big},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True},
                ],
            },
        ],
        records=1,
    )
    run = {"metadata": {"namespace": "ns", "name": "r"}}
    rendered = run_views.transcript(stored, run=run)
    assert "<details><summary>result (2.0 KiB)</summary>" in rendered
    assert "← error of <strong>fetch</strong>" in rendered
    # On the run's page only the start of a long result; all of it on the turn's own page.
    assert big not in rendered and '<a href="/runs/ns/r/turns/2">The whole result</a>' in rendered
    whole = run_views.whole_turn(run, stored, 2)
    assert big in whole and "← result of <strong>fetch</strong>" in whole


def test_an_identity_never_shows_its_token() -> None:
    identity = Identity("alice", bearer="secret-token-123")
    assert "secret-token-123" not in repr(identity) and "secret-token-123" not in str(identity)
    assert identity.headers("Bearer console") == [("Authorization", "Bearer secret-token-123")]
    impersonated = Identity("bob", user="bob", groups=("a", "b")).headers("Bearer console")
    assert impersonated == [
        ("Authorization", "Bearer console"),
        ("Impersonate-User", "bob"),
        ("Impersonate-Group", "a"),
        ("Impersonate-Group", "b"),
    ]


def test_turns_a_compaction_replaced_are_marked_and_its_summary_shown_in_their_place() -> None:
    messages = [{"role": "user", "content": "the task"}]
    for i in range(3):
        messages += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": f"ok {i}"}]
    compaction = {"summary": "did steps 0 and 1", "boundary": 5, "turns": 2, "tokensBefore": 900}
    compaction |= {"tokensAfter": 200, "iteration": 3}
    state = {"context": {"compaction": compaction, "log": [{"turns": 2}]}}
    rendered = run_views.transcript(Transcript(messages=messages, state=state, records=1))
    summarized = [
        n
        for n in range(1, 8)
        if f'class="turn summarized {"user" if n % 2 else "assistant"}" id="turn-{n}"' in rendered
    ]
    assert summarized == [2, 3, 4, 5]  # the task stays; turns up to the boundary were summarized
    assert rendered.index("Compaction summary") < rendered.index('id="turn-6"')
    assert rendered.index('id="turn-5"') < rendered.index("Compaction summary")
    assert "did steps 0 and 1" in rendered and "Context compacted 1 time(s)" in rendered


def test_tokens_and_spend_over_the_run_are_drawn_without_any_script_or_asset() -> None:
    progress = [
        Progress(i, i, TokenUsage(input_tokens=100 * i, output_tokens=10 * i), Decimal("0.001") * i)
        for i in (1, 2, 3)
    ]
    chart = run_views.usage_chart(progress)
    assert (
        chart.startswith('<figure class="usage-chart"><svg')
        and "<script" not in chart
        and "href" not in chart
    )
    assert "330 tokens, $0.0030" in chart
    assert chart.count("<polyline") == 2  # tokens and spend
    unpriced = [Progress(p.iterations, p.tool_calls, p.usage, None) for p in progress]
    assert run_views.usage_chart(unpriced).count("<polyline") == 1
    assert run_views.usage_chart(progress[:1]) == ""


def test_old_tool_results_the_loop_sends_as_a_marker_are_marked_cleared() -> None:
    messages: list[dict[str, object]] = [{"role": "user", "content": [{"type": "text", "text": "task"}]}]
    for i in range(4):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{i}", "name": "fetch", "input": {}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "x" * 2000}],
            }
        )
    run = {
        "metadata": {"namespace": "ns", "name": "r"},
        "spec": {
            "model": {"name": "claude-haiku-4-5"},
            "context": {"clearToolResults": {"keepNewest": 2, "batch": 1}},
        },
    }
    rendered = run_views.transcript(Transcript(messages=messages, records=1), run=run)
    cleared = [n for n in range(1, 10) if f'id="turn-{n}"' in rendered and _cleared_in(rendered, n)]
    assert cleared == [3, 5]  # the two oldest of four results; the newest two are sent whole
    off = {**run, "spec": {**run["spec"], "context": {"clearToolResults": {"enabled": False}}}}
    assert "cleared:" not in run_views.transcript(Transcript(messages=messages, records=1), run=off)


def _cleared_in(rendered: str, number: int) -> bool:
    start = rendered.index(f'id="turn-{number}"')
    end = rendered.find('id="turn-', start + 1)
    return "cleared: the model is now sent a marker" in rendered[start : end if end > 0 else None]


def test_the_timeline_lays_each_answer_and_its_tools_end_to_end_with_their_lengths() -> None:
    calls = (ToolTrace("t1", "fetch", "h", 3.0, True), ToolTrace("t2", "grep", "h", 1.0, True))
    rows = [
        TraceRow(1, "tool_use", calls, TokenUsage(), "m", model_seconds=2.0),
        TraceRow(2, "end_turn", (), TokenUsage(), "m", model_seconds=1.0),
    ]
    chart = run_views.timeline(rows)
    assert chart.count("<rect") == 3  # answer 1, its tools (at once: the longest), answer 2
    assert "iteration 1: fetch, grep 3.00 s" in chart and "iteration 2: model 1.00 s" in chart
    assert "6.0 s" in chart  # 2 + 3 + 1
    assert "<script" not in chart
    unmeasured = [TraceRow(1, "end_turn", (), TokenUsage(), "m")]
    assert run_views.timeline(unmeasured) == ""


def test_a_trace_row_keeps_its_model_time_through_the_transcript_and_old_rows_have_none() -> None:
    row = TraceRow(3, "tool_use", (), TokenUsage(input_tokens=5), "m", "req_1", model_seconds=0.25)
    assert row.as_dict()["model_ms"] == 250.0
    assert TraceRow.from_dict(row.as_dict()) == row
    old = {k: v for k, v in row.as_dict().items() if k != "model_ms"}
    assert TraceRow.from_dict(old).model_seconds is None
