"""The A2A tool against a2a-sdk's own server (tests/support/a2a_sdk.py) and against a flaky one: the card
read once, the message sent with the call's idempotency key, each way a remote task can end, retries."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall
from agentrun.tools.environment import SecretMissing, ToolStartError
from agentrun.tools.registry import open_tools
from tests.support.a2a_sdk import SDKAgent, sdk_agent_serving
from tests.support.local_servers import serving_app
from tests.support.waiting import until
from tests.unit.tools.environment import StaticEnvironment

HEADERS = '{"Authorization": "Bearer remote-token-1"}'


@pytest.fixture
async def sdk() -> AsyncIterator[SDKAgent]:
    async with sdk_agent_serving() as running:
        yield running


def _spec(tool: dict[str, Any], **entry: Any) -> AgentRunSpec:
    return AgentRunSpec.model_validate({"task": "t", "tools": [{"a2a": tool, **entry}]})


def _call(text: str, key: str = "run-uid-1:toolu_1") -> ToolCall:
    return ToolCall("toolu_1", "echo", {"message": text}, key, 1)


def _environment() -> StaticEnvironment:
    return StaticEnvironment(secrets={("remote", "headers"): HEADERS})


async def test_the_card_makes_one_tool_whose_description_lists_the_agents_skills(sdk: SDKAgent) -> None:
    async with open_tools(_spec({"name": "echo", "url": sdk.url}), StaticEnvironment()) as tools:
        definition = tools["echo"].definition
    assert list(tools) == ["echo"]
    assert "Repeats what it is told." in definition.description
    assert "- Repeat: Says the message back. (e.g. say hello)" in definition.description
    assert definition.input_schema["required"] == ["message"]


async def test_a_call_sends_the_message_with_its_idempotency_key_and_the_secrets_headers(
    sdk: SDKAgent,
) -> None:
    spec = _spec({"name": "echo", "url": sdk.url, "headersFrom": {"name": "remote", "key": "headers"}})
    async with open_tools(spec, _environment()) as tools:
        output = await tools["echo"].call(_call("hello there"))
    assert (output.content, output.is_error) == ("echo: hello there", False)
    assert sdk.agent.message_ids == ["run-uid-1:toolu_1"]
    assert all(h.get("authorization") == "Bearer remote-token-1" for h in sdk.recorder.headers)
    assert all(h.get("a2a-version") == "1.0" for h in sdk.recorder.headers)


async def test_a_missing_header_secret_keeps_the_run_waiting_for_it(sdk: SDKAgent) -> None:
    spec = _spec({"name": "echo", "url": sdk.url, "headersFrom": {"name": "absent", "key": "headers"}})
    with pytest.raises(SecretMissing):
        async with open_tools(spec, StaticEnvironment()):
            pass


async def test_a_failed_remote_task_is_a_recoverable_error_with_the_remotes_words(sdk: SDKAgent) -> None:
    async with open_tools(_spec({"name": "echo", "url": sdk.url}), StaticEnvironment()) as tools:
        with pytest.raises(ToolError) as caught:
            await tools["echo"].call(_call("please fail"))
    assert caught.value.code == "remote_failed" and caught.value.recoverable
    assert "TASK_STATE_FAILED: the echo agent cannot do that" in caught.value.message


async def test_a_remote_that_asks_a_question_is_told_to_the_model_as_such(sdk: SDKAgent) -> None:
    async with open_tools(_spec({"name": "echo", "url": sdk.url}), StaticEnvironment()) as tools:
        with pytest.raises(ToolError) as caught:
            await tools["echo"].call(_call("a question"))
    assert caught.value.code == "input_required" and "which cluster do you mean?" in caught.value.message


async def test_a_task_still_running_at_the_tools_timeout_is_canceled_on_the_remote(sdk: SDKAgent) -> None:
    spec = _spec({"name": "echo", "url": sdk.url, "timeoutSeconds": 1.5})
    async with open_tools(spec, StaticEnvironment()) as tools:
        with pytest.raises(ToolError) as caught:
            await tools["echo"].call(_call("slow work"))
    assert caught.value.code == "timeout" and "canceled" in caught.value.message
    assert len(sdk.agent.canceled) == 1


async def test_an_unreachable_card_fails_the_runs_start_naming_the_tool() -> None:
    spec = _spec({"name": "echo", "url": "http://127.0.0.1:9"})
    with pytest.raises(ToolStartError, match=r"spec\.tools\[0\]\.a2a: the Agent Card at http://127.0.0.1:9/"):
        async with open_tools(spec, StaticEnvironment(), sleep=_no_wait):
            pass


async def _no_wait(_: float) -> None:
    return None


class Flaky:
    """A JSON-RPC endpoint that answers 503 ``failures`` times, then a completed task; its card names it."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.message_ids: list[str] = []
        self.url = ""

    async def card(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        interface = {"url": self.url + "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        return aiohttp.web.json_response({"name": "flaky", "supportedInterfaces": [interface], "skills": []})

    async def rpc(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        self.message_ids.append(body["params"]["message"]["messageId"])
        if self.failures:
            self.failures -= 1
            return aiohttp.web.json_response({"error": "busy"}, status=503)
        task = {
            "id": "t1",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"parts": [{"text": "done"}]}],
        }
        return aiohttp.web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {"task": task}})


async def _flaky_tool_answer(failures: int) -> tuple[Flaky, Any]:
    flaky = Flaky(failures)
    app = aiohttp.web.Application()
    app.router.add_get("/.well-known/agent-card.json", flaky.card)
    app.router.add_post("/rpc", flaky.rpc)
    async with (
        serving_app(app) as flaky.url,
        open_tools(_spec({"name": "echo", "url": flaky.url}), StaticEnvironment(), sleep=_no_wait) as tools,
    ):
        try:
            return flaky, await tools["echo"].call(_call("x"))
        except ToolError as exc:
            return flaky, exc


async def test_5xx_answers_are_retried_twice_with_the_same_message_id() -> None:
    flaky, output = await _flaky_tool_answer(2)
    assert output.content == "done"
    assert flaky.message_ids == ["run-uid-1:toolu_1"] * 3


async def test_a_remote_still_failing_after_the_retries_is_unavailable_and_recoverable() -> None:
    flaky, error = await _flaky_tool_answer(5)
    assert isinstance(error, ToolError) and error.code == "unavailable" and error.recoverable
    assert len(flaky.message_ids) == 3


def test_an_entry_with_a2a_and_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly one of builtin, http, mcp, agent, a2a"):
        _spec({"name": "echo", "url": "http://x"}, builtin={"name": "current_time"})


async def test_a_call_cancelled_by_the_run_cancels_its_remote_task(sdk: SDKAgent) -> None:
    """The loop cancels a call when the run is cancelled or times out: the remote stops spending too."""
    async with open_tools(_spec({"name": "echo", "url": sdk.url}), StaticEnvironment()) as tools:
        call = asyncio.create_task(tools["echo"].call(_call("slow work")))
        await until(lambda: sdk.agent.texts, "the remote to start the task", 10)
        # A request after the one that started the task (a poll) means the answer with its id arrived:
        # cancelled before that, the tool has no task to cancel (a busy machine shows the gap).
        sent = len(sdk.recorder.headers)
        await until(lambda: len(sdk.recorder.headers) > sent, "the tool to poll its task", 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert len(sdk.agent.canceled) == 1


async def test_requires_approval_on_the_entry_makes_each_call_wait_for_a_decision(sdk: SDKAgent) -> None:
    spec = _spec({"name": "echo", "url": sdk.url}, requiresApproval=True, writeKey="remote")
    async with open_tools(spec, StaticEnvironment()) as tools:
        definition = tools["echo"].definition
    assert (definition.requires_approval, definition.write_key) == (True, "remote")


async def test_a_card_the_server_does_not_have_fails_the_start_with_its_answer(sdk: SDKAgent) -> None:
    spec = _spec({"name": "echo", "url": sdk.url + "/elsewhere"})
    with pytest.raises(
        ToolStartError, match=r"spec\.tools\[0\]\.a2a: the Agent Card at .* was refused: HTTP 404"
    ):
        async with open_tools(spec, StaticEnvironment(), sleep=_no_wait):
            pass
