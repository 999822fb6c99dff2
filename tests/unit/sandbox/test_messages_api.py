"""The fake Messages API, driven over HTTP by the real anthropic SDK (never patched)."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Literal

import aiohttp
import anthropic
import httpx2
import pytest
import yaml

from agentrun_sandbox.messages.api import Bill, FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    ConnectionReset,
    HttpError,
    Reply,
    Script,
    ScriptUsage,
    SlowResponse,
    StreamError,
    TruncatedStream,
    text_block,
    tool_use_block,
)
from agentrun_sandbox.messages.script_files import load_scripts, scripts_to_data

MODEL = "claude-opus-4-6"
KEY = "sk-ant-test-key"
REPO = Path(__file__).resolve().parents[3]

LIST_PODS = {
    "name": "list_pods",
    "description": "List pods in a namespace.",
    "input_schema": {
        "type": "object",
        "properties": {"namespace": {"type": "string"}, "selector": {"type": "string"}},
        "required": ["namespace"],
    },
}
WRITE_FILE = {
    "name": "write_file",
    "description": "Write a file.",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}
POD_INPUT = {"namespace": "default", "selector": "app=web,tier=frontend", "limit": 25}
FILE_INPUT = {"path": "/tmp/report.txt", "content": "a long report body " * 4}

TOOL_THEN_ANSWER = Script(
    "[scenario:tool-then-answer]",
    [
        Reply(
            [
                text_block("Let me look at the pods in the cluster first."),
                tool_use_block("list_pods", POD_INPUT),
            ],
            usage=ScriptUsage(
                input_tokens=120,
                output_tokens=40,
                cache_creation_input_tokens=30,
                cache_read_input_tokens=900,
            ),
        ),
        Reply([text_block("All 3 pods are running.")]),
    ],
)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(message: anthropic.types.Message, output: str = "pod-a Running") -> list[dict[str, Any]]:
    """The assistant turn and the user turn that answers every tool_use in it."""
    results = [
        {"type": "tool_result", "tool_use_id": block.id, "content": output}
        for block in message.content
        if block.type == "tool_use"
    ]
    return [
        {"role": "assistant", "content": [b.to_dict() for b in message.content]},
        {"role": "user", "content": results},
    ]


@pytest.fixture
async def api() -> AsyncIterator[FakeMessagesAPI]:
    async with FakeMessagesAPI([TOOL_THEN_ANSWER]).running(host="127.0.0.1", port=0) as server:
        yield server


@pytest.fixture
async def client(api: FakeMessagesAPI) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0, timeout=10) as sdk:
        yield sdk


async def streamed(
    client: anthropic.AsyncAnthropic, messages: Sequence[Any], **kwargs: Any
) -> anthropic.types.Message:
    kwargs.setdefault("max_tokens", 1024)
    async with client.messages.stream(model=MODEL, messages=messages, **kwargs) as stream:
        return await stream.get_final_message()


async def created(
    client: anthropic.AsyncAnthropic, messages: Sequence[Any], **kwargs: Any
) -> anthropic.types.Message:
    kwargs.setdefault("max_tokens", 1024)
    return await client.messages.create(model=MODEL, messages=messages, **kwargs)


# ---------------------------------------------------------------------------------------------- replies


async def test_streamed_reply_is_assembled_by_the_sdk_into_text_and_tool_use(
    api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    message = await streamed(client, [user("Check pods [scenario:tool-then-answer]")], tools=[LIST_PODS])

    assert message.model == MODEL
    assert message.id.startswith("msg_01")
    assert message.stop_reason == "tool_use"
    text, tool = message.content
    assert text.type == "text"
    assert text.text == "Let me look at the pods in the cluster first."
    assert tool.type == "tool_use"
    assert tool.name == "list_pods"
    assert tool.input == POD_INPUT
    assert tool.id.startswith("toolu_01")


async def test_non_streamed_reply_is_identical_to_the_streamed_one(client: anthropic.AsyncAnthropic) -> None:
    messages = [user("Check pods [scenario:tool-then-answer]")]

    via_stream = await streamed(client, messages, tools=[LIST_PODS])
    via_create = await created(client, messages, tools=[LIST_PODS])

    assert via_create.to_dict() == via_stream.to_dict()


async def test_usage_reports_the_scripted_token_and_cache_counts_in_both_modes(
    client: anthropic.AsyncAnthropic,
) -> None:
    messages = [user("[scenario:tool-then-answer]")]

    for message in (await streamed(client, messages), await created(client, messages)):
        assert message.usage.input_tokens == 120
        assert message.usage.output_tokens == 40
        assert message.usage.cache_creation_input_tokens == 30
        assert message.usage.cache_read_input_tokens == 900


async def test_stream_sends_tool_input_as_several_partial_json_chunks(
    client: anthropic.AsyncAnthropic,
) -> None:
    stream = await client.messages.create(
        model=MODEL, max_tokens=1024, messages=[user("[scenario:tool-then-answer]")], stream=True
    )
    events = [event async for event in stream]

    names = [event.type for event in events]
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    pieces = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(pieces) >= 4
    assert pieces[0] == ""
    assert json.loads("".join(pieces)) == POD_INPUT
    texts = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert len(texts) >= 2
    start = events[0]
    assert start.type == "message_start"
    assert start.message.usage.input_tokens == 120
    assert start.message.usage.cache_read_input_tokens == 900
    delta = events[-2]
    assert delta.type == "message_delta"
    assert delta.delta.stop_reason == "tool_use"
    assert delta.usage.output_tokens == 40


async def test_refusal_reply_carries_stop_reason_and_stop_details() -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "Exploit development."}
    script = Script("[scenario:refusal]", [Reply([], stop_reason="refusal", stop_details=details)])
    async with (
        FakeMessagesAPI([script]).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        for message in (
            await streamed(client, [user("[scenario:refusal]")]),
            await created(client, [user("[scenario:refusal]")]),
        ):
            assert message.stop_reason == "refusal"
            assert message.content == []
            assert message.stop_details is not None
            assert message.stop_details.category == "cyber"


async def test_responses_carry_a_request_id_header(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(model=MODEL, max_tokens=10, messages=[user("hi")]) as stream:
        await stream.get_final_message()
    raw = await client.messages.with_raw_response.create(model=MODEL, max_tokens=10, messages=[user("hi")])

    assert stream.request_id is not None
    assert stream.request_id.startswith("req_")
    assert raw.request_id is not None
    assert raw.request_id != stream.request_id


# ---------------------------------------------------------------------------------------------- steps


async def test_step_is_chosen_by_the_number_of_assistant_messages_in_the_request(
    api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    history: list[Any] = [user("Check pods [scenario:tool-then-answer]")]
    first = await created(client, history, tools=[LIST_PODS])
    history += answer(first)

    second = await streamed(client, history, tools=[LIST_PODS])

    assert second.stop_reason == "end_turn"
    assert [block.type for block in second.content] == ["text"]
    assert [(r.script, r.step) for r in api.requests] == [
        ("[scenario:tool-then-answer]", 0),
        ("[scenario:tool-then-answer]", 1),
    ]
    assert api.protocol_errors == []


async def test_a_restarted_client_resending_the_history_gets_the_same_step_and_ids(
    api: FakeMessagesAPI,
) -> None:
    messages = [user("[scenario:tool-then-answer]")]
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as before:
        first = await created(before, messages)
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as after:
        again = await streamed(after, messages)

    assert again.to_dict() == first.to_dict()


async def test_script_can_be_selected_by_model_name() -> None:
    script = Script(None, [Reply([text_block("chosen by model")])], model="fake-model-a")
    async with (
        FakeMessagesAPI([script]).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        chosen = await client.messages.create(
            model="fake-model-a", max_tokens=10, messages=[user("anything")]
        )
        await client.messages.create(model="fake-model-b", max_tokens=10, messages=[user("anything")])

    assert chosen.content[0].type == "text"
    assert chosen.content[0].text == "chosen by model"
    assert [r.outcome for r in api.requests] == ["reply", "demo_brain"]


async def test_request_past_the_last_step_is_rejected_with_400_and_recorded(
    api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    history: list[Any] = [user("[scenario:tool-then-answer]")]
    first = await created(client, history)
    history += answer(first)
    second = await created(client, history)
    history += [{"role": "assistant", "content": second.content[0].text}, user("and now?")]

    with pytest.raises(anthropic.BadRequestError, match="has 2 step"):
        await created(client, history)
    assert len(api.protocol_errors) == 1


# ---------------------------------------------------------------------------------------------- faults


def faulty(*faults: Any) -> Script:
    return Script("[scenario:faulty]", [Reply([text_block("finally fine")], faults=faults)])


@pytest.fixture
async def faulty_api(request: pytest.FixtureRequest) -> AsyncIterator[FakeMessagesAPI]:
    async with FakeMessagesAPI([faulty(*request.param)]).running() as server:
        yield server


@pytest.mark.parametrize("faulty_api", [(HttpError.rate_limit(retry_after=3, times=2),)], indirect=True)
async def test_fault_is_served_twice_then_the_reply_for_the_same_conversation(
    faulty_api: FakeMessagesAPI,
) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:
        for _ in range(2):
            with pytest.raises(anthropic.RateLimitError):
                await created(client, [user("[scenario:faulty] run 1")])
        message = await created(client, [user("[scenario:faulty] run 1")])
        with pytest.raises(anthropic.RateLimitError):
            await created(client, [user("[scenario:faulty] run 2")])

    assert message.content[0].type == "text"
    assert message.content[0].text == "finally fine"
    assert [r.outcome for r in faulty_api.requests] == ["http_error", "http_error", "reply", "http_error"]


@pytest.mark.parametrize("faulty_api", [(HttpError.rate_limit(retry_after=3, times=1),)], indirect=True)
async def test_only_generated_answers_are_billed_with_the_usage_they_report_and_the_callers_user_id(
    faulty_api: FakeMessagesAPI,
) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:
        with pytest.raises(anthropic.RateLimitError):
            await created(client, [user("[scenario:faulty] run 1")], metadata={"user_id": "run-a"})
        message = await created(client, [user("[scenario:faulty] run 1")], metadata={"user_id": "run-a"})

    [bill] = faulty_api.bills
    usage = message.usage
    assert (bill.user_id, bill.model, bill.request_id) == ("run-a", MODEL, faulty_api.requests[1].request_id)
    assert bill.total == usage.input_tokens + usage.output_tokens > 0
    faulty_api.clear()
    assert faulty_api.bills == []


@pytest.mark.parametrize(
    "faulty_api",
    [(HttpError(error_type="overloaded_error", headers={"retry-after-ms": "10"}, times=2),)],
    indirect=True,
)
async def test_sdk_retries_through_transient_faults_when_its_retries_are_enabled(
    faulty_api: FakeMessagesAPI,
) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=2) as client:
        message = await created(client, [user("[scenario:faulty]")])

    assert message.stop_reason == "end_turn"
    assert [r.headers["x-stainless-retry-count"] for r in faulty_api.requests] == ["0", "1", "2"]


@pytest.mark.parametrize(
    "faulty_api",
    [(HttpError(error_type="overloaded_error", headers={"x-should-retry": "false"}),)],
    indirect=True,
)
async def test_sdk_does_not_retry_when_the_response_says_x_should_retry_false(
    faulty_api: FakeMessagesAPI,
) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=2) as client:
        with pytest.raises(anthropic.OverloadedError):
            await created(client, [user("[scenario:faulty]")])

    assert len(faulty_api.requests) == 1


@pytest.mark.parametrize(
    "faulty_api", [(HttpError.rate_limit(retry_after=7, retry_after_ms=7000),)], indirect=True
)
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_rate_limit_error_exposes_retry_after_headers_on_the_response(
    faulty_api: FakeMessagesAPI, stream: bool
) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:
        with pytest.raises(anthropic.RateLimitError) as caught:
            await (streamed if stream else created)(client, [user("[scenario:faulty]")])

    error = caught.value
    assert error.status_code == 429
    assert error.response.headers["retry-after"] == "7"
    assert error.response.headers["retry-after-ms"] == "7000"
    assert error.type == "rate_limit_error"
    assert error.request_id == faulty_api.requests[-1].request_id


@pytest.mark.parametrize(
    ("error_type", "status", "exception"),
    [
        ("invalid_request_error", 400, anthropic.BadRequestError),
        ("authentication_error", 401, anthropic.AuthenticationError),
        ("billing_error", 402, anthropic.PaymentRequiredError),
        ("permission_error", 403, anthropic.PermissionDeniedError),
        ("not_found_error", 404, anthropic.NotFoundError),
        ("request_too_large", 413, anthropic.ContentTooLargeError),
        ("rate_limit_error", 429, anthropic.RateLimitError),
        ("api_error", 500, anthropic.InternalServerError),
        ("timeout_error", 504, anthropic.GatewayTimeoutError),
        ("overloaded_error", 529, anthropic.OverloadedError),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_http_error_faults_surface_as_the_matching_sdk_exception(
    error_type: str, status: int, exception: type[anthropic.APIStatusError], stream: bool
) -> None:
    async with (
        FakeMessagesAPI([faulty(HttpError(error_type=error_type))]).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        with pytest.raises(exception) as caught:
            await (streamed if stream else created)(client, [user("[scenario:faulty]")])

    assert type(caught.value) is exception
    assert caught.value.status_code == status
    assert caught.value.type == error_type


@pytest.mark.parametrize("faulty_api", [(StreamError(),)], indirect=True)
async def test_overloaded_error_event_inside_a_200_stream_is_a_plain_api_status_error_after_some_text(
    faulty_api: FakeMessagesAPI,
) -> None:
    received: list[str] = []
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:

        async def read_text() -> None:
            async with client.messages.stream(
                model=MODEL, max_tokens=10, messages=[user("[scenario:faulty]")]
            ) as stream:
                async for text in stream.text_stream:
                    received.append(text)

        with pytest.raises(anthropic.APIStatusError) as caught:
            await read_text()

    error = caught.value
    assert type(error) is anthropic.APIStatusError
    assert error.status_code == 200
    assert error.type == "overloaded_error"
    assert error.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": faulty_api.requests[-1].request_id,
    }
    assert "".join(received) == "finally fine"[: len("".join(received))]
    assert received


@pytest.mark.parametrize("faulty_api", [(StreamError(),)], indirect=True)
async def test_stream_error_fault_on_a_non_streaming_request_is_a_529(faulty_api: FakeMessagesAPI) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:
        with pytest.raises(anthropic.OverloadedError):
            await created(client, [user("[scenario:faulty]")])


@pytest.mark.parametrize("faulty_api", [(ConnectionReset(during="headers"),)], indirect=True)
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_connection_reset_before_the_headers_is_an_api_connection_error(
    faulty_api: FakeMessagesAPI, stream: bool
) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:
        with pytest.raises(anthropic.APIConnectionError) as caught:
            await (streamed if stream else created)(client, [user("[scenario:faulty]")])

    assert type(caught.value) is anthropic.APIConnectionError
    assert isinstance(caught.value.__cause__, httpx2.TransportError)


@pytest.mark.parametrize("faulty_api", [(ConnectionReset(during="body"),)], indirect=True)
async def test_connection_reset_during_a_stream_escapes_the_sdk_as_a_raw_httpx_read_error(
    faulty_api: FakeMessagesAPI,
) -> None:
    """Fact: the SDK wraps transport errors only while sending; mid-stream they are not APIErrors."""
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:
        with pytest.raises(httpx2.ReadError) as caught:
            await streamed(client, [user("[scenario:faulty]")])

    assert not isinstance(caught.value, anthropic.APIError)


@pytest.mark.parametrize("faulty_api", [(ConnectionReset(during="body"),)], indirect=True)
async def test_connection_reset_during_a_json_body_is_an_api_connection_error(
    faulty_api: FakeMessagesAPI,
) -> None:
    async with anthropic.AsyncAnthropic(api_key=KEY, base_url=faulty_api.url, max_retries=0) as client:
        with pytest.raises(anthropic.APIConnectionError):
            await created(client, [user("[scenario:faulty]")])


@pytest.mark.parametrize("faulty_api", [(SlowResponse(seconds=30),)], indirect=True)
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_slow_response_is_an_api_timeout_error_and_the_retry_is_answered(
    faulty_api: FakeMessagesAPI, stream: bool
) -> None:
    async with anthropic.AsyncAnthropic(
        api_key=KEY, base_url=faulty_api.url, max_retries=0, timeout=0.3
    ) as client:
        with pytest.raises(anthropic.APITimeoutError):
            await (streamed if stream else created)(client, [user("[scenario:faulty]")])
        message = await (streamed if stream else created)(client, [user("[scenario:faulty]")])

    assert message.stop_reason == "end_turn"


def truncating(mode: Literal["max_tokens", "cut"]) -> Script:
    return Script(
        "[scenario:truncated]",
        [
            Reply(
                [text_block("Writing the report."), tool_use_block("write_file", FILE_INPUT)],
                faults=[TruncatedStream(mode=mode)],
            )
        ],
    )


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_tool_use_truncated_by_max_tokens_keeps_only_the_complete_properties(stream: bool) -> None:
    """Fact: the SDK's partial-JSON parse drops the string that was cut, so the input looks valid but lacks
    `content`; only stop_reason max_tokens tells the loop the tool call is incomplete."""
    async with (
        FakeMessagesAPI([truncating("max_tokens")]).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        message = await (streamed if stream else created)(
            client, [user("[scenario:truncated]")], tools=[WRITE_FILE], max_tokens=64
        )
        retried = await created(client, [user("[scenario:truncated]")], tools=[WRITE_FILE])

    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 64
    text, tool = message.content
    assert text.type == "text"
    assert text.text == "Writing the report."
    assert tool.type == "tool_use"
    assert tool.name == "write_file"
    assert tool.input == {"path": "/tmp/report.txt"}
    assert retried.stop_reason == "tool_use"
    assert retried.content[1].type == "tool_use"
    assert retried.content[1].input == FILE_INPUT


async def test_stream_that_ends_mid_block_gives_a_final_message_without_stop_reason() -> None:
    """Fact: a stream that simply stops is not an error for the SDK; stop_reason stays None and
    output_tokens keeps message_start's value."""
    async with (
        FakeMessagesAPI([truncating("cut")]).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        message = await streamed(client, [user("[scenario:truncated]")], tools=[WRITE_FILE])

    assert message.stop_reason is None
    assert message.usage.output_tokens == 1
    assert message.content[1].type == "tool_use"
    assert message.content[1].input == {"path": "/tmp/report.txt"}


async def test_json_body_that_ends_early_is_an_api_connection_error() -> None:
    async with (
        FakeMessagesAPI([truncating("cut")]).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        with pytest.raises(anthropic.APIConnectionError) as caught:
            await created(client, [user("[scenario:truncated]")], tools=[WRITE_FILE])

    assert isinstance(caught.value.__cause__, httpx2.RemoteProtocolError)


async def test_bare_fault_step_fails_every_time() -> None:
    script = Script("[scenario:locked-out]", [HttpError(error_type="permission_error")])
    async with (
        FakeMessagesAPI([script]).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        for _ in range(3):
            with pytest.raises(anthropic.PermissionDeniedError):
                await created(client, [user("[scenario:locked-out]")])


# ---------------------------------------------------------------------------------------------- protocol


async def test_unanswered_tool_use_id_is_rejected_with_400_invalid_request_error(
    api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    first = await created(client, [user("[scenario:tool-then-answer]")], tools=[LIST_PODS])
    assistant, _ = answer(first)
    history = [user("[scenario:tool-then-answer]"), assistant, user("I ran nothing.")]

    with pytest.raises(anthropic.BadRequestError) as caught:
        await created(client, history, tools=[LIST_PODS])

    tool_id = first.content[1].id
    assert caught.value.type == "invalid_request_error"
    assert f"`tool_use` ids were found without `tool_result` blocks immediately after: {tool_id}" in str(
        caught.value
    )
    assert api.protocol_errors == [caught.value.api_message]
    assert api.requests[-1].outcome == "invalid_request"


async def test_request_without_max_tokens_is_rejected_with_400(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="max_tokens: Field required"):
        await client.post("/v1/messages", body={"model": MODEL, "messages": [user("hi")]}, cast_to=object)


# ---------------------------------------------------------------------------------------------- auth & log


async def test_required_api_key_is_accepted_as_bearer_token_or_x_api_key_and_others_get_401() -> None:
    async with FakeMessagesAPI(require_api_key=KEY).running() as api:
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as bearer:
            await created(bearer, [user("hi")])
        async with anthropic.AsyncAnthropic(
            api_key=None, auth_token=None, default_headers={"x-api-key": KEY}, base_url=api.url, max_retries=0
        ) as header:
            await created(header, [user("hi")])
        async with anthropic.AsyncAnthropic(api_key="wrong", base_url=api.url, max_retries=0) as wrong:
            with pytest.raises(anthropic.AuthenticationError):
                await created(wrong, [user("hi")])

    assert [r.outcome for r in api.requests] == ["demo_brain", "demo_brain", "unauthorized"]
    assert api.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert api.requests[1].headers["x-api-key"] == KEY


async def test_recorded_requests_keep_headers_and_body_and_redact_secrets_on_request(
    api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    await created(client, [user("Check pods [scenario:tool-then-answer]")], tools=[LIST_PODS])
    await created(client, [user("something else")])

    recorded = api.requests_for("[scenario:tool-then-answer]")
    assert len(recorded) == 1
    request = recorded[0]
    assert request.method == "POST"
    assert request.path == "/v1/messages"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["anthropic-version"]
    assert request.body["tools"] == [LIST_PODS]
    assert request.model == MODEL
    assert request.stream is False
    assert request.arrived_at <= time.time()
    redacted = next(r for r in api.redacted_requests() if r.script)
    assert redacted.headers["authorization"] == "<redacted>"
    assert redacted.body == request.body
    assert len(api.requests_for(MODEL)) == 2

    api.clear()

    assert api.requests == []


async def test_count_tokens_and_unknown_paths_answer_like_the_api(client: anthropic.AsyncAnthropic) -> None:
    counted = await client.messages.count_tokens(model=MODEL, messages=[user("x" * 400)])
    with pytest.raises(anthropic.NotFoundError):
        await client.get("/v1/no-such-thing", cast_to=object)

    assert counted.input_tokens >= 100


# ---------------------------------------------------------------------------------------------- demo brain

BRAIN_TOOLS = [
    {
        "name": "get_pods",
        "description": "List pods.",
        "input_schema": {
            "type": "object",
            "properties": {
                "namespace": {"type": "string"},
                "webhookUrl": {"type": "string"},
                "limit": {"type": "integer", "maximum": 5},
                "verbose": {"type": "boolean"},
            },
            "required": ["namespace", "webhookUrl", "limit"],
        },
    },
    {
        "name": "fetch",
        "description": "Fetch a URL.",
        "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
    },
    {"name": "never_called", "description": "A third tool.", "input_schema": {"type": "object"}},
]


async def test_demo_brain_calls_up_to_two_offered_tools_then_summarises_their_results(
    api: FakeMessagesAPI, client: anthropic.AsyncAnthropic
) -> None:
    history: list[Any] = [user("Find out why the web pods restart.")]

    calling = await streamed(client, history, tools=BRAIN_TOOLS)
    history += answer(calling, output="restarted 14 times: OOMKilled " + "x" * 300)
    summary = await created(client, history, tools=BRAIN_TOOLS)

    assert calling.stop_reason == "tool_use"
    calls = [block for block in calling.content if block.type == "tool_use"]
    assert [(c.name, c.input) for c in calls] == [
        ("get_pods", {"namespace": "default", "webhookUrl": "https://example.com/", "limit": 5}),
        ("fetch", {"url": "https://example.com/"}),
    ]
    assert summary.stop_reason == "end_turn"
    text = summary.content[0]
    assert text.type == "text"
    assert "restarted 14 times: OOMKilled" in text.text
    assert "x" * 300 not in text.text
    assert [r.outcome for r in api.requests] == ["demo_brain", "demo_brain"]
    assert api.protocol_errors == []


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"tools": BRAIN_TOOLS, "tool_choice": {"type": "none"}}],
    ids=["no-tools", "tool-choice-none"],
)
async def test_demo_brain_answers_with_text_when_it_may_not_call_tools(
    client: anthropic.AsyncAnthropic, kwargs: dict[str, Any]
) -> None:
    message = await created(client, [user("Say hello.")], **kwargs)

    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["text"]


async def test_demo_brain_calls_only_the_tool_a_forced_tool_choice_names(
    client: anthropic.AsyncAnthropic,
) -> None:
    message = await created(
        client, [user("Go.")], tools=BRAIN_TOOLS, tool_choice={"type": "tool", "name": "never_called"}
    )

    assert [(b.type, getattr(b, "name", None)) for b in message.content] == [("tool_use", "never_called")]


async def test_demo_brain_usage_is_deterministic_and_grows_with_request_and_reply_size(
    client: anthropic.AsyncAnthropic,
) -> None:
    small = await created(client, [user("Summarise.")])
    again = await created(client, [user("Summarise.")])
    large = await created(client, [user("Summarise. " + "context " * 500)])

    assert small.usage == again.usage
    assert large.usage.input_tokens > small.usage.input_tokens * 10
    assert large.usage.output_tokens > small.usage.output_tokens
    assert small.usage.cache_read_input_tokens == 0


# ---------------------------------------------------------------------------------------------- files & CLI

SCRIPT_FILE = """
scripts:
  - name: yaml-flaky
    match: "[scenario:yaml]"
    steps:
      - faults:
          - {kind: http_error, error_type: overloaded_error, times: 1}
        reply:
          content:
            - {type: tool_use, name: list_pods, input: {namespace: kube-system}}
          usage: {input_tokens: 10, output_tokens: 5, cache_read_input_tokens: 7}
      - reply:
          content: [{type: text, text: "from yaml"}]
  - model: fake-auth-failure
    steps:
      - fault: {kind: http_error, error_type: authentication_error}
"""


async def test_scripts_load_from_a_yaml_file_holding_several_scripts(tmp_path: Path) -> None:
    path = tmp_path / "scripts.yaml"
    path.write_text(SCRIPT_FILE)

    async with (
        FakeMessagesAPI(load_scripts(path)).running() as api,
        anthropic.AsyncAnthropic(api_key=KEY, base_url=api.url, max_retries=0) as client,
    ):
        with pytest.raises(anthropic.OverloadedError):
            await created(client, [user("[scenario:yaml]")], tools=[LIST_PODS])
        first = await streamed(client, [user("[scenario:yaml]")], tools=[LIST_PODS])
        second = await created(client, [user("[scenario:yaml]"), *answer(first)], tools=[LIST_PODS])
        with pytest.raises(anthropic.AuthenticationError):
            await client.messages.create(model="fake-auth-failure", max_tokens=5, messages=[user("hi")])

    assert first.content[0].type == "tool_use"
    assert first.content[0].input == {"namespace": "kube-system"}
    assert first.usage.cache_read_input_tokens == 7
    assert second.content[0].type == "text"
    assert second.content[0].text == "from yaml"
    assert [r.script for r in api.requests] == ["yaml-flaky"] * 3 + ["fake-auth-failure"]


def raise_open_file_limit(needed: int) -> int:
    """Client and server sockets share this process; CI machines often default to 1024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


async def test_a_thousand_concurrent_requests_all_wait_out_the_latency_together() -> None:
    count = min(1000, (raise_open_file_limit(2 * 1000 + 200) - 200) // 2)
    body = {"model": MODEL, "max_tokens": 16, "messages": [user("hello")]}
    finished: list[float] = []
    async with (
        FakeMessagesAPI(latency_seconds=1.0).running() as api,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):

        async def one(index: int) -> int:
            payload = {**body, "stream": index % 2 == 0}
            async with session.post(
                f"{api.url}/v1/messages", json=payload, headers={"anthropic-version": "2023-06-01"}
            ) as response:
                await response.read()
                finished.append(time.time())
                return response.status

        statuses = await asyncio.gather(*(one(index) for index in range(count)))

        assert statuses == [200] * count
        assert len(api.requests) == count
        assert max(r.arrived_at for r in api.requests) < min(finished)


async def test_child_process_prints_ready_then_serves_scripts_until_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "scripts.yaml"
    path.write_text(yaml.safe_dump(scripts_to_data([TOOL_THEN_ANSWER])))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "operator"), os.environ.get("PYTHONPATH")])),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrun_sandbox.messages.server",
        "--port",
        "0",
        "--script",
        str(path),
        "--latency",
        "0.01",
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode()
        assert line.startswith("READY http://127.0.0.1:")
        url = line.split()[1]
        async with anthropic.AsyncAnthropic(api_key=KEY, base_url=url, max_retries=0) as client:
            message = await streamed(client, [user("[scenario:tool-then-answer]")])
        assert message.content[1].type == "tool_use"
        assert message.content[1].input == POD_INPUT
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(process.wait(), timeout=30)

    assert returncode == 0


def test_a_bill_counts_a_server_side_compaction_reported_only_in_usage_iterations() -> None:
    usage = {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_creation_input_tokens": 2,
        "cache_read_input_tokens": 3,
        "iterations": [
            {"type": "compaction", "input_tokens": 100, "output_tokens": 20},
            {"type": "message", "input_tokens": 10, "output_tokens": 5},
        ],
    }
    assert Bill("req", "run", MODEL, usage).total == 20 + 120
