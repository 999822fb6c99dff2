"""Wire helpers of the fake Messages API: chunking, truncation, ids and token estimates."""

from __future__ import annotations

import json

from agentrun_sandbox.messages.wire import chunk, derived_id, estimate_tokens, truncated_content


def test_chunks_reassemble_and_anything_longer_than_a_character_is_split() -> None:
    text = json.dumps({"namespace": "default", "selector": "app=web"})

    pieces = chunk(text, 16)

    assert "".join(pieces) == text
    assert len(pieces) >= 3
    assert chunk("ab", 16) == ["a", "b"]
    assert chunk("", 16) == []


def test_truncated_tool_input_keeps_the_properties_complete_at_the_cut() -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"a": "x" * 10, "b": "y" * 40}}

    (cut,) = truncated_content([block], keep=0.5)

    assert cut["input"] == {"a": "x" * 10}
    assert block["input"] == {"a": "x" * 10, "b": "y" * 40}


def test_derived_ids_are_stable_and_look_like_the_apis() -> None:
    first = derived_id("toolu", "conversation", 0, 1)

    assert first == derived_id("toolu", "conversation", 0, 1)
    assert first != derived_id("toolu", "conversation", 1, 1)
    assert first.startswith("toolu_01")
    assert len(first) == len("toolu_01") + 22


def test_token_estimate_is_a_quarter_of_the_characters_and_at_least_one() -> None:
    assert estimate_tokens("") == 1
    assert estimate_tokens("x" * 400) == 100
