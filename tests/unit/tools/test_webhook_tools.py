"""Webhook tools against a real aiohttp receiver on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.api.tool_specs import HTTPTool, ServiceRef
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import Tool, ToolCall
from agentrun.tools.environment import SecretMissing
from agentrun.tools.errors import InvalidToolSpec
from agentrun.tools.registry import check_tools, open_tools
from agentrun.tools.webhooking import endpoint
from tests.unit.tools.environment import StaticEnvironment
from tests.unit.tools.servers import Answer, WebhookReceiver

SCHEMA = {
    "type": "object",
    "properties": {"ticket": {"type": "string"}, "priority": {"type": "integer", "minimum": 1}},
    "required": ["ticket"],
    "additionalProperties": False,
}


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver().running() as server:
        yield server


def _spec(http: dict[str, Any]) -> AgentRunSpec:
    tool = {"name": "open_ticket", "description": "Opens a ticket.", "inputSchema": SCHEMA, **http}
    return AgentRunSpec.model_validate({"task": "t", "tools": [{"http": tool}]})


def _call(tool_input: dict[str, Any], tool_use_id: str = "toolu_1") -> ToolCall:
    return ToolCall(tool_use_id, "open_ticket", tool_input, f"run-uid-1:{tool_use_id}", 1)


async def _call_tool(spec: AgentRunSpec, call: ToolCall, env: StaticEnvironment | None = None) -> Any:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with open_tools(spec, env or StaticEnvironment(), sleep=sleep) as tools:
        tool: Tool = tools["open_ticket"]
        return await tool.call(call), sleeps


async def test_schema_invalid_input_is_a_recoverable_tool_error_and_never_reaches_the_server(
    receiver: WebhookReceiver,
) -> None:
    spec = _spec({"url": f"{receiver.url}/tickets"})
    with pytest.raises(ToolError) as caught:
        await _call_tool(spec, _call({"ticket": "disk full", "priority": 0}))
    assert caught.value.code == "invalid_input"
    assert caught.value.recoverable is True
    assert "priority" in caught.value.message and "minimum of 1" in caught.value.message
    assert receiver.received == []


async def test_valid_input_is_posted_as_json_with_the_calls_idempotency_key(
    receiver: WebhookReceiver,
) -> None:
    receiver.default = Answer(200, {"id": "T-42"})
    spec = _spec({"url": f"{receiver.url}/tickets"})
    (output, _) = await _call_tool(spec, _call({"ticket": "disk full", "priority": 2}, "toolu_abc"))
    assert json.loads(output.content) == {"id": "T-42"}
    [request] = receiver.received
    assert request.path == "/tickets"
    assert request.body == {"ticket": "disk full", "priority": 2}
    assert request.headers["Idempotency-Key"] == "run-uid-1:toolu_abc"
    assert request.headers["Content-Type"] == "application/json"


async def test_a_5xx_is_retried_with_backoff_and_the_same_idempotency_key(receiver: WebhookReceiver) -> None:
    receiver.answers = [Answer(503, {"message": "busy"}), Answer(502, "bad gateway")]
    receiver.default = Answer(201, {"id": "T-7"})
    spec = _spec({"url": f"{receiver.url}/tickets"})
    output, sleeps = await _call_tool(spec, _call({"ticket": "x"}))
    assert json.loads(output.content) == {"id": "T-7"}
    keys = [r.headers["Idempotency-Key"] for r in receiver.received]
    assert keys == ["run-uid-1:toolu_1"] * 3
    assert sleeps == [0.5, 1.0]


async def test_5xx_on_every_attempt_ends_as_a_recoverable_unavailable_error(
    receiver: WebhookReceiver,
) -> None:
    receiver.default = Answer(500, {"error": {"message": "database down"}})
    spec = _spec({"url": f"{receiver.url}/tickets"})
    with pytest.raises(ToolError) as caught:
        await _call_tool(spec, _call({"ticket": "x"}))
    assert (caught.value.code, caught.value.recoverable) == ("unavailable", True)
    assert "3 attempts" in caught.value.message and "database down" in caught.value.message
    assert len(receiver.received) == 3


async def test_a_4xx_is_a_recoverable_error_with_the_bodys_message_as_hint_and_not_retried(
    receiver: WebhookReceiver,
) -> None:
    receiver.default = Answer(422, {"message": "ticket must mention a host name"})
    spec = _spec({"url": f"{receiver.url}/tickets"})
    with pytest.raises(ToolError) as caught:
        await _call_tool(spec, _call({"ticket": "x"}))
    error = caught.value
    assert (error.code, error.recoverable, error.hint) == (
        "rejected",
        True,
        "ticket must mention a host name",
    )
    assert "HTTP 422" in error.message
    assert len(receiver.received) == 1


async def test_401_is_fatal_by_default(receiver: WebhookReceiver) -> None:
    receiver.default = Answer(401, {"message": "token expired"})
    spec = _spec({"url": f"{receiver.url}/tickets"})
    with pytest.raises(ToolError) as caught:
        await _call_tool(spec, _call({"ticket": "x"}))
    assert (caught.value.code, caught.value.recoverable) == ("unauthorized", False)
    assert caught.value.as_payload()["recoverable"] is False


async def test_403_is_recoverable_when_auth_errors_are_configured_recoverable(
    receiver: WebhookReceiver,
) -> None:
    receiver.default = Answer(403, {"message": "this project is read-only"})
    spec = _spec({"url": f"{receiver.url}/tickets", "authErrorsRecoverable": True})
    with pytest.raises(ToolError) as caught:
        await _call_tool(spec, _call({"ticket": "x"}))
    assert (caught.value.code, caught.value.recoverable) == ("forbidden", True)
    assert caught.value.hint == "this project is read-only"


async def test_a_slow_receiver_gives_a_structured_timeout_error(receiver: WebhookReceiver) -> None:
    receiver.default = Answer(200, {"ok": True}, delay=2.0)
    spec = _spec({"url": f"{receiver.url}/tickets", "timeoutSeconds": 0.2})
    with pytest.raises(ToolError) as caught:
        await _call_tool(spec, _call({"ticket": "x"}))
    assert (caught.value.code, caught.value.recoverable) == ("timeout", True)
    assert len(receiver.received) == 1


async def test_connection_refused_is_retried_then_reported_as_unavailable() -> None:
    spec = _spec({"url": "http://127.0.0.1:9/tickets"})
    with pytest.raises(ToolError) as caught:
        await _call_tool(spec, _call({"ticket": "x"}))
    assert caught.value.code == "unavailable" and "connection failed" in caught.value.message


async def test_headers_from_a_secret_are_sent_with_every_request(receiver: WebhookReceiver) -> None:
    env = StaticEnvironment(secrets={("ticketing", "headers"): '{"Authorization": "Bearer s3cret"}'})
    spec = _spec({"url": f"{receiver.url}/t", "headersFrom": {"name": "ticketing", "key": "headers"}})
    await _call_tool(spec, _call({"ticket": "x"}), env)
    assert receiver.received[0].headers["Authorization"] == "Bearer s3cret"


async def test_a_missing_header_secret_names_the_field_that_references_it() -> None:
    spec = _spec({"url": "http://127.0.0.1:9/t", "headersFrom": {"name": "ticketing", "key": "headers"}})
    with pytest.raises(SecretMissing) as caught:
        await _call_tool(spec, _call({"ticket": "x"}))
    assert "spec.tools[0].http.headersFrom" in str(caught.value)
    assert "default/ticketing" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("not json", "is not JSON"),
        ('["a"]', "JSON object"),
        ('{"Idempotency-Key": "mine"}', "operator owns"),
    ],
)
async def test_a_malformed_header_secret_is_an_invalid_spec_that_does_not_echo_the_secret(
    value: str, problem: str
) -> None:
    env = StaticEnvironment(secrets={("ticketing", "headers"): value})
    spec = _spec({"url": "http://127.0.0.1:9/t", "headersFrom": {"name": "ticketing", "key": "headers"}})
    with pytest.raises(InvalidToolSpec) as caught:
        await _call_tool(spec, _call({"ticket": "x"}), env)
    assert problem in str(caught.value) and "spec.tools[0].http.headersFrom" in str(caught.value)
    assert value not in str(caught.value)


def test_an_invalid_input_schema_is_rejected_naming_the_field() -> None:
    spec = AgentRunSpec.model_validate(
        {
            "task": "t",
            "tools": [
                {"builtin": {"name": "calculator"}},
                {"http": {"name": "x", "description": "d", "url": "http://h/", "inputSchema": {"type": 7}}},
            ],
        }
    )
    with pytest.raises(
        InvalidToolSpec, match=r"spec\.tools\[1\]\.http\.inputSchema: not a valid JSON Schema"
    ):
        check_tools(spec)


def test_an_input_schema_referencing_a_url_is_refused_so_the_operator_never_fetches_it() -> None:
    schema = {"type": "object", "properties": {"x": {"$ref": "http://169.254.169.254/latest/meta-data"}}}
    spec = AgentRunSpec.model_validate(
        {
            "task": "t",
            "tools": [{"http": {"name": "x", "description": "d", "url": "http://h/", "inputSchema": schema}}],
        }
    )
    with pytest.raises(InvalidToolSpec, match=r"inputSchema: .*\$ref .* points outside the schema"):
        check_tools(spec)


def test_a_webhook_needs_exactly_one_of_url_and_service() -> None:
    spec = AgentRunSpec.model_validate({"task": "t", "tools": [{"http": {"name": "x", "description": "d"}}]})
    with pytest.raises(InvalidToolSpec, match=r"spec\.tools\[0\]\.http: set exactly one of url and service"):
        check_tools(spec)


def test_a_service_reference_becomes_the_in_cluster_url_defaulting_to_the_runs_namespace() -> None:
    tool = HTTPTool(name="x", description="d", service=ServiceRef(name="tickets", port=8080, path="/v1/open"))
    assert endpoint(tool, "team-a") == "http://tickets.team-a.svc:8080/v1/open"
    other = HTTPTool(name="x", description="d", service=ServiceRef(name="t", namespace="ops", scheme="https"))
    assert endpoint(other, "team-a") == "https://t.ops.svc:80/"
