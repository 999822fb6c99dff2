"""The fake Messages API's part in context compaction: a window it enforces, summaries it writes."""

from __future__ import annotations

import pytest

from agentrun_sandbox.messages.planning import plan
from agentrun_sandbox.messages.script import HttpError, Reply, Script, text_block, tool_use_block
from agentrun_sandbox.messages.script_files import parse_scripts, scripts_to_data

TASK = {"role": "user", "content": [{"type": "text", "text": "[scenario:c] read logs"}]}
SCRIPT = Script(
    "[scenario:c]",
    [Reply([tool_use_block("logs", {}, id=f"toolu_{i}")]) for i in range(3)] + [Reply([text_block("ok")])],
    context_window=1_000,
)


def _turn(i: int, size: int = 10) -> list[dict[str, object]]:
    return [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": f"toolu_{i}", "name": "logs", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "x" * size}],
        },
    ]


def _body(messages: list[dict[str, object]]) -> dict[str, object]:
    return {"model": "m", "max_tokens": 100, "messages": messages}


def test_a_script_window_round_trips_through_the_file_form_and_must_be_positive() -> None:
    [parsed] = parse_scripts(scripts_to_data([SCRIPT]))
    assert parsed.context_window == 1_000
    with pytest.raises(ValueError, match="context_window: expected a positive integer"):
        parse_scripts({"match": "x", "steps": [], "context_window": 0})


def test_a_request_above_the_window_is_refused_as_the_real_api_words_it() -> None:
    chosen = plan(_body([TASK, *_turn(0, 8_000)]), [SCRIPT], {}, demo_brain=False)
    assert isinstance(chosen.fault, HttpError) and chosen.fault.status_code == 400
    assert (chosen.fault.error_message or "").startswith("prompt is too long: ")


def test_a_summary_request_is_answered_by_the_server_and_consumes_no_script_step() -> None:
    ask = {"type": "text", "text": "[context compaction] summarize"}
    turns = _turn(0) + _turn(1)
    last = turns[-1]
    turns[-1] = {**last, "content": [*last["content"], ask]}  # type: ignore[list-item]
    chosen = plan(_body([TASK, *turns]), [SCRIPT], {}, demo_brain=False)
    assert chosen.fault is None and chosen.step == 2
    assert chosen.reply.content[0]["text"] == "Summary of 2 turns: 2 tool results (logs)."


def test_after_a_compaction_the_summary_s_turns_count_toward_the_step() -> None:
    compacted = {
        "role": "user",
        "content": [*TASK["content"], {"type": "text", "text": '<summary turns="2">\nS\n</summary>'}],  # type: ignore[list-item]
    }
    chosen = plan(_body([compacted, *_turn(2)]), [SCRIPT], {}, demo_brain=False)
    assert chosen.step == 3 and chosen.reply.content[0]["text"] == "ok"
    plain = plan(_body([TASK]), [SCRIPT], {}, demo_brain=False)
    assert chosen.conversation == plain.conversation  # the same conversation, its ids unchanged
