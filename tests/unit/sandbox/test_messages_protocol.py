"""Request validation of the fake Messages API: the cheap checks that catch operator protocol bugs."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_sandbox.messages.protocol import (
    ProtocolError,
    assistant_turns,
    first_user_text,
    tool_results,
    validate_request,
)

TOOL = {"name": "list_pods", "input_schema": {"type": "object", "properties": {}}}
CALL = {"type": "tool_use", "id": "toolu_01A", "name": "list_pods", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "ok"}


def request(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, "messages": messages, **extra}


def test_a_complete_tool_round_trip_is_valid() -> None:
    body = request(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "text", "text": "calling"}, CALL]},
            {"role": "user", "content": [RESULT, {"type": "text", "text": "anything else?"}]},
        ],
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "list_pods"},
    )

    assert validate_request(body) is body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            "max_tokens: Field required",
            id="missing-max-tokens",
        ),
        pytest.param(request([]), "at least one message", id="no-messages"),
        pytest.param(
            request([{"role": "assistant", "content": "x"}]), "first message", id="starts-with-assistant"
        ),
        pytest.param(
            request([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
            'multiple "user" roles in a row',
            id="roles-do-not-alternate",
        ),
        pytest.param(
            request(
                [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [CALL]},
                    {"role": "user", "content": "no results"},
                ]
            ),
            "ids were found without `tool_result` blocks immediately after: toolu_01A",
            id="unanswered-tool-use",
        ),
        pytest.param(
            request([{"role": "user", "content": "go"}, {"role": "assistant", "content": [CALL]}]),
            "ids were found without `tool_result` blocks immediately after: toolu_01A",
            id="tool-use-in-final-assistant-message",
        ),
        pytest.param(
            request(
                [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [CALL]},
                    {"role": "user", "content": [{**RESULT, "tool_use_id": "toolu_01B"}]},
                ]
            ),
            "unexpected `tool_use_id` found in `tool_result` blocks: toolu_01B",
            id="tool-result-for-unknown-id",
        ),
        pytest.param(
            request(
                [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [CALL]},
                    {"role": "user", "content": [RESULT, RESULT]},
                ]
            ),
            "answered twice",
            id="tool-use-answered-twice",
        ),
        pytest.param(
            request(
                [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [CALL]},
                    {"role": "user", "content": [{"type": "text", "text": "here:"}, RESULT]},
                ]
            ),
            "must come first",
            id="tool-result-after-text",
        ),
        pytest.param(
            request([{"role": "user", "content": [{"type": "text", "text": ""}]}]),
            "must be non-empty",
            id="empty-text-block",
        ),
        pytest.param(
            request([{"role": "user", "content": "x"}], tools=[{**TOOL, "name": "list pods!"}]),
            "String should match pattern",
            id="bad-tool-name",
        ),
        pytest.param(
            request([{"role": "user", "content": "x"}], tools=[TOOL, TOOL]),
            "unique",
            id="duplicate-tool-name",
        ),
        pytest.param(
            request([{"role": "user", "content": "x"}], tools=[{"type": "bash_20250124", "name": "shell"}]),
            "tools.0.bash_20250124.name: Input should be 'bash'",
            id="typed-tool-under-another-name",
        ),
        pytest.param(
            request(
                [{"role": "user", "content": "x"}],
                tools=[TOOL],
                tool_choice={"type": "tool", "name": "delete_cluster"},
            ),
            "not one of the provided tools",
            id="tool-choice-names-unknown-tool",
        ),
        pytest.param(
            request([{"role": "user", "content": "x"}], tool_choice={"type": "any"}),
            "requires `tools`",
            id="tool-choice-any-without-tools",
        ),
        pytest.param(
            request([{"role": "user", "content": "x"}], temperature=1.5),
            "temperature",
            id="temperature-out-of-range",
        ),
    ],
)
def test_invalid_requests_are_rejected_with_a_message_naming_the_problem(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(")):
        validate_request(body)


def test_final_assistant_prefill_may_be_empty() -> None:
    body = request([{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}])
    assert validate_request(body) == body


def test_readers_find_the_first_user_text_the_step_and_named_tool_results() -> None:
    body = request(
        [
            {"role": "user", "content": [{"type": "text", "text": "task [scenario:a]"}]},
            {"role": "assistant", "content": [CALL]},
            {
                "role": "user",
                "content": [{**RESULT, "content": [{"type": "text", "text": "3 pods"}], "is_error": True}],
            },
        ]
    )

    assert first_user_text(body) == "task [scenario:a]"
    assert assistant_turns(body) == 1
    assert tool_results(body) == [("list_pods", "3 pods", True)]


def test_the_apis_own_client_tools_are_sent_by_type_and_name_without_a_schema() -> None:
    tools = [
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
    body = validate_request(
        request([{"role": "user", "content": "x"}], tools=tools, tool_choice={"type": "tool", "name": "bash"})
    )
    assert body["tools"] == tools, "the typed tools were accepted as they are, and tool_choice may name one"
