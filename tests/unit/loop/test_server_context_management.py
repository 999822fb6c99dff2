"""Server-side context management (spec.context strategy Server) through the real SDK and adapter:
the request asks the Messages API's betas for it, the loop leaves that part alone, a compaction
block goes back verbatim, and the compaction's tokens count in usage and budgets."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from agentrun.api.stops import StopReason
from agentrun.api.usage import TokenUsage
from agentrun.loop.config import ContextConfig
from agentrun.loop.errors import FatalModelError
from agentrun.loop.events import ContextCompacted
from agentrun.loop.protocols import ModelRequest, ServerContextEdits
from agentrun.loop.state import RunState
from agentrun.loop.windowing import SUMMARY_REQUEST, cleared, overflow
from agentrun.model.anthropic_calling import AnthropicModel, response_from_json
from agentrun.model.streaming import StreamedMessage
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.context_editing import CLEARED, apply, compaction_key
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from agentrun_sandbox.messages.wire import estimate_input_tokens
from tests.support.loop_harness import FakeTool, run_scripted

CLEAR_BETA = "context-management-2025-06-27"
COMPACT_BETA = "compact-2026-01-12"
BIG = "line of a pod log\n" * 700  # about 12,600 characters: about 3,150 tokens for the fake server
CLIENT_MARKER = "[cleared to save context"


def _turns(count: int) -> list[Reply]:
    return [
        Reply([tool_use_block("logs", {"pod": f"p{i}"})], usage=ScriptUsage(100, 10)) for i in range(count)
    ]


def _answer() -> Reply:
    return Reply([text_block("all pods checked")], usage=ScriptUsage(100, 10))


def _texts(body: dict[str, Any]) -> str:
    return str(body["messages"])


def _server(
    clear: str = "Client", compact: str = "Client", clearing: bool = True, **compaction: Any
) -> dict[str, Any]:
    return {
        "context": {
            "clearToolResults": {
                "enabled": clearing,
                "strategy": clear,
                "keepNewest": 2,
                "batch": 1,
                "minChars": 0,
            },
            "compaction": {"strategy": compact, **compaction},
            "contextWindowTokens": 20_000,
        }
    }


async def test_the_client_strategy_asks_the_api_for_no_context_management() -> None:
    run = await run_scripted([*_turns(4), _answer()], tools=[FakeTool("logs", BIG)], spec=_server())
    assert run.outcome.stop_reason is StopReason.END_TURN
    for request in run.requests:
        assert "context_management" not in request.body
        assert "anthropic-beta" not in request.headers
    assert CLIENT_MARKER in _texts(run.requests[-1].body)


async def test_server_clearing_sends_the_clear_edit_with_its_beta_and_the_loop_clears_nothing() -> None:
    run = await run_scripted([*_turns(4), _answer()], tools=[FakeTool("logs", BIG)], spec=_server("Server"))
    assert run.outcome.stop_reason is StopReason.END_TURN
    for request in run.requests:
        assert request.outcome == "reply"
        assert request.body["context_management"] == {
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "keep": {"type": "tool_uses", "value": 2},
                    "trigger": {"type": "tool_uses", "value": 3},
                }
            ]
        }
        assert request.headers["anthropic-beta"] == CLEAR_BETA
    last = run.requests[-1].body
    assert CLIENT_MARKER not in _texts(last)
    assert _texts(last).count("line of a pod log") == 4 * 700
    assert not run.recorder.of(ContextCompacted)


async def test_server_compaction_triggers_at_the_window_share_and_the_loop_never_asks_for_a_summary() -> None:
    spec = _server(compact="Server", clearing=False, thresholdPercent=50)
    run = await run_scripted([*_turns(6), _answer()], tools=[FakeTool("logs", BIG)], spec=spec)
    assert run.outcome.stop_reason is StopReason.END_TURN, run.outcome.message
    first = run.requests[0]
    assert first.body["context_management"] == {
        "edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 10_000}}]
    }
    assert first.headers["anthropic-beta"] == COMPACT_BETA
    assert not any(SUMMARY_REQUEST in _texts(r.body) for r in run.requests)
    # The compaction block was kept first in its assistant message and sent back unchanged.
    compacting = next(i for i, r in enumerate(run.requests) if estimate_input_tokens(r.body) >= 10_000)
    answer = run.requests[compacting + 1].body["messages"][-2]
    block = answer["content"][0]
    assert block["type"] == "compaction"
    assert block["encrypted_content"] == compaction_key(block["content"])
    for later in run.requests[compacting + 2 :]:
        assert later.body["messages"][2 * compacting + 1]["content"][0] == block
    events = run.recorder.of(ContextCompacted)
    assert (events[0].compactions, events[0].iteration) == (1, compacting + 1)
    assert events[0].tokens_before > events[0].tokens_after
    assert events[0].usage.input_tokens == estimate_input_tokens(run.requests[compacting].body)


async def test_the_server_s_compaction_tokens_count_in_usage_and_budgets() -> None:
    spec = _server(compact="Server", clearing=False, thresholdPercent=50)
    run = await run_scripted([*_turns(6), _answer()], tools=[FakeTool("logs", BIG)], spec=spec)
    compaction = sum((e.usage for e in run.recorder.of(ContextCompacted)), TokenUsage())
    usage = run.finished.progress.usage
    assert usage.input_tokens == 7 * 100 + compaction.input_tokens
    assert usage.output_tokens == 7 * 10 + compaction.output_tokens
    # A budget the scripted answers alone stay within is spent by the compaction.
    budget = {**spec, "limits": {"tokenBudget": 7 * 110 + 50}}
    run = await run_scripted([*_turns(6), _answer()], tools=[FakeTool("logs", BIG)], spec=budget)
    assert run.outcome.stop_reason is StopReason.TOKEN_BUDGET_EXCEEDED


def _results(body: dict[str, Any], *, cleared: bool) -> set[str]:
    """Ids of the tool results the model reads after the fake API applied the request's clearing."""
    seen = apply(json.loads(json.dumps(body))).body
    return {
        str(b["tool_use_id"])
        for m in seen["messages"]
        for b in m["content"]
        if b.get("type") == "tool_result" and (b.get("content") == CLEARED) is cleared
    }


async def test_with_clearing_on_the_server_a_summary_request_has_the_api_clear_what_it_cleared_before() -> (
    None
):
    """The summary request lacks the tool uses of the turns kept after the cut, so asked with the same
    keep and trigger the API would send whole results it had cleared in the request before."""
    spec = _server("Server", thresholdPercent=60, keepNewestTurns=2)
    spec["context"]["contextWindowTokens"] = 19_000
    turns = [Reply([tool_use_block("logs", {"pod": f"p{i}"})]) for i in range(10)]  # usage as sent
    run = await run_scripted([*turns, _answer()], tools=[FakeTool("logs", BIG)], spec=spec)
    assert run.outcome.stop_reason is StopReason.END_TURN, run.outcome.message
    summaries = [(index, r) for index, r in enumerate(run.requests) if SUMMARY_REQUEST in _texts(r.body)]
    assert summaries
    cleared_again = 0
    for index, summary in summaries:
        before = run.requests[index - 1].body
        sent = _results(summary.body, cleared=False) | _results(summary.body, cleared=True)
        assert _results(before, cleared=True) & sent == _results(summary.body, cleared=True)
        cleared_again += len(_results(summary.body, cleared=True))
    assert cleared_again, "some summary request followed a request whose older results the API cleared"


async def test_both_parts_on_the_server_send_both_edits_and_both_betas() -> None:
    spec = _server("Server", "Server", thresholdPercent=50)
    run = await run_scripted([*_turns(2), _answer()], tools=[FakeTool("logs")], spec=spec)
    assert run.outcome.stop_reason is StopReason.END_TURN
    request = run.requests[0]
    assert [e["type"] for e in request.body["context_management"]["edits"]] == [
        "clear_tool_uses_20250919",
        "compact_20260112",
    ]
    assert request.headers["anthropic-beta"].split(",") == [CLEAR_BETA, COMPACT_BETA]


def test_the_loop_leaves_clearing_and_compaction_to_the_server_when_told() -> None:
    state = RunState.fresh("task")
    for i in range(4):
        state.messages.append({"role": "assistant", "content": [tool_use_block("logs", {}, id=f"t{i}")]})
        state.messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": BIG}]}
        )
    client = ContextConfig(keep_tool_results=1, clear_batch=1, clear_min_chars=0, window_tokens=10_000)
    server = ContextConfig(
        keep_tool_results=1,
        clear_batch=1,
        clear_min_chars=0,
        window_tokens=10_000,
        clear_on_server=True,
        compact_on_server=True,
    )
    assert CLIENT_MARKER in str(cleared(state.messages, client))
    assert cleared(state.messages, server) == state.messages
    assert client.threshold_tokens == 8_000 and server.threshold_tokens is None
    assert client.server_edits is None
    assert server.server_edits == ServerContextEdits(
        clear_keep=1, clear_trigger=2, compact=True, compact_trigger_tokens=8_000
    )
    request = ModelRequest(model="m", max_tokens=10, messages=state.messages)
    finish = overflow(state, server, "prompt is too long", request)
    assert "spec.context.compaction.strategy: Server" in finish.outcome.message


def _events(block: dict[str, Any], usage: dict[str, Any], management: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "message_start", "message": {"model": "m", "content": [], "usage": {"input_tokens": 50}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "compaction", "content": None}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", **block}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "done"}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": usage,
            "context_management": management,
        },
        {"type": "message_stop"},
    ]


SUMMARY = {"content": "what happened so far", "encrypted_content": "opaque"}
USAGE = {
    "input_tokens": 50,
    "output_tokens": 7,
    "iterations": [
        {
            "type": "compaction",
            "input_tokens": 9000,
            "output_tokens": 300,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
        {"type": "message", "input_tokens": 50, "output_tokens": 7},
    ],
}
MANAGEMENT = {
    "applied_edits": [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3, "cleared_input_tokens": 900}
    ]
}


def test_a_streamed_compaction_block_is_kept_whole_and_its_usage_and_edits_are_read() -> None:
    message = StreamedMessage("req_1")
    for event in _events(SUMMARY, USAGE, MANAGEMENT):
        message.add(event)
    response = message.response()
    assert response.content == [{"type": "compaction", **SUMMARY}, {"type": "text", "text": "done"}]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (9050, 307)
    edits = response.context_edits
    assert edits is not None and edits.compacted
    assert (edits.cleared_tool_uses, edits.cleared_input_tokens) == (3, 900)
    assert edits.compaction_usage is not None and edits.compaction_usage.input_tokens == 9000


def test_a_json_answer_with_a_compaction_block_reads_the_same() -> None:
    body = {
        "type": "message",
        "model": "m",
        "content": [{"type": "compaction", **SUMMARY}, {"type": "text", "text": "done"}],
        "stop_reason": "end_turn",
        "usage": USAGE,
        "context_management": MANAGEMENT,
    }
    response = response_from_json(json.dumps(body).encode(), "req_1")
    assert response.content[0] == {"type": "compaction", **SUMMARY}
    assert response.usage.input_tokens == 9050
    assert response.context_edits is not None and response.context_edits.cleared_tool_uses == 3


def test_an_answer_without_server_edits_reports_none() -> None:
    message = StreamedMessage("req_1")
    for event in _events(SUMMARY, {"output_tokens": 7}, {"applied_edits": []}):
        if event.get("index") != 0:
            message.add({**event, "index": 0} if "index" in event else event)
    response = message.response()
    assert response.content == [{"type": "text", "text": "done"}]
    assert response.context_edits is None


@pytest.fixture
async def fake_api() -> Any:
    conversation = [Reply([text_block("ok")]) for _ in range(4)]
    async with FakeMessagesAPI([Script("[cm]", conversation)], demo_brain=False).running() as api:
        yield api


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "[cm] task"}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": [tool_use_block("logs", {}, id=f"t{i}")]})
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": BIG}]}
        )
    return messages


async def test_the_fake_api_clears_old_tool_uses_and_reports_the_applied_edit(
    fake_api: FakeMessagesAPI,
) -> None:
    client = anthropic.AsyncAnthropic(api_key="k", base_url=fake_api.url, max_retries=0)
    edits = ServerContextEdits(clear_keep=1, clear_trigger=2)
    request = ModelRequest(model="m", max_tokens=100, messages=_history(3), tools=(), server_context=edits)
    response = await AnthropicModel(client).complete(request)
    assert response.context_edits is not None
    assert response.context_edits.cleared_tool_uses == 2
    assert response.context_edits.cleared_input_tokens > 6000
    await client.close()


async def test_the_fake_api_refuses_context_management_without_its_beta_header(
    fake_api: FakeMessagesAPI,
) -> None:
    client = anthropic.AsyncAnthropic(api_key="k", base_url=fake_api.url, max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="requires the anthropic-beta header"):
        await client.messages.create(
            model="m",
            max_tokens=10,
            messages=[{"role": "user", "content": "[cm] task"}],
            extra_body={"context_management": {"edits": [{"type": "compact_20260112"}]}},
        )
    await client.close()


async def test_the_fake_api_refuses_a_compaction_block_that_was_changed_or_dropped(
    fake_api: FakeMessagesAPI,
) -> None:
    client = anthropic.AsyncAnthropic(api_key="k", base_url=fake_api.url, max_retries=0)
    model = AnthropicModel(client)
    edits = ServerContextEdits(compact=True, compact_trigger_tokens=1000)
    first = await model.complete(
        ModelRequest(model="m", max_tokens=100, messages=_history(1), server_context=edits)
    )
    assert first.content[0]["type"] == "compaction" and first.context_edits is not None
    history = [
        *_history(1),
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "go on"},
    ]
    again = await model.complete(
        ModelRequest(model="m", max_tokens=100, messages=history, server_context=edits)
    )
    assert again.context_edits is None  # what comes after the block is small again
    changed = {**first.content[0], "content": "something else"}
    for content in ([changed, *first.content[1:]], first.content[1:]):
        bad = [*history[:3], {"role": "assistant", "content": content}, history[4]]
        with pytest.raises(FatalModelError) as refused:
            await model.complete(ModelRequest(model="m", max_tokens=100, messages=bad, server_context=edits))
        assert refused.value.status == 400
    await client.close()
