"""MCP servers: a real MCPServer over streamable HTTP (uvicorn, 127.0.0.1) started by each test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

from agentrun.api.spec import AgentRunSpec
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall
from agentrun.tools.environment import ToolStartError
from agentrun.tools.errors import InvalidToolSpec
from agentrun.tools.registry import open_tools
from tests.unit.tools.environment import StaticEnvironment
from tests.unit.tools.servers import RunningMCP, mcp_serving


@pytest.fixture
async def mcp() -> AsyncIterator[RunningMCP]:
    async with mcp_serving() as running:
        yield running


def _spec(server: dict[str, Any], **extra: Any) -> AgentRunSpec:
    return AgentRunSpec.model_validate({"task": "t", "tools": [{"mcp": server}], **extra})


def _call(name: str, tool_input: dict[str, Any]) -> ToolCall:
    return ToolCall("toolu_1", name, tool_input, "run-uid-1:toolu_1", 1)


async def test_tools_are_listed_once_at_start_under_the_server_prefix(mcp: RunningMCP) -> None:
    async with open_tools(_spec({"name": "inv", "url": mcp.url}), StaticEnvironment()) as tools:
        assert sorted(tools) == ["inv_count_items", "inv_delete_everything", "inv_reserve"]
        definition = tools["inv_count_items"].definition
        assert definition.description == "Counts the items stored in a warehouse."
        assert definition.input_schema["required"] == ["warehouse"]
        output = await tools["inv_count_items"].call(_call("inv_count_items", {"warehouse": "north"}))
        assert output.content == "17"


async def test_allowed_tools_limits_what_the_model_is_offered(mcp: RunningMCP) -> None:
    spec = _spec({"name": "inv", "url": mcp.url, "allowedTools": ["count_items", "reserve"]})
    async with open_tools(spec, StaticEnvironment()) as tools:
        assert sorted(tools) == ["inv_count_items", "inv_reserve"]


async def test_an_allowed_tool_the_server_does_not_offer_is_an_invalid_spec(mcp: RunningMCP) -> None:
    spec = _spec({"name": "inv", "url": mcp.url, "allowedTools": ["count_items", "launch"]})
    with pytest.raises(InvalidToolSpec) as caught:
        async with open_tools(spec, StaticEnvironment()):
            pass
    assert "spec.tools[0].mcp.allowedTools" in str(caught.value) and "launch" in str(caught.value)


async def test_a_tool_error_of_the_server_becomes_a_recoverable_tool_error(mcp: RunningMCP) -> None:
    async with open_tools(_spec({"name": "inv", "url": mcp.url}), StaticEnvironment()) as tools:
        with pytest.raises(ToolError) as caught:
            await tools["inv_reserve"].call(_call("inv_reserve", {"warehouse": "north", "amount": 50}))
        assert caught.value.code == "tool_error" and caught.value.recoverable
        assert "only 10 items can be reserved in north, asked for 50" in caught.value.message
        ok = await tools["inv_reserve"].call(_call("inv_reserve", {"warehouse": "north", "amount": 3}))
        assert ok.content == "reserved 3 in north"


async def test_invalid_arguments_rejected_by_the_server_are_a_tool_error(mcp: RunningMCP) -> None:
    async with open_tools(_spec({"name": "inv", "url": mcp.url}), StaticEnvironment()) as tools:
        with pytest.raises(ToolError) as caught:
            await tools["inv_count_items"].call(_call("inv_count_items", {"warehouse": 3, "extra": 1}))
        assert caught.value.code == "tool_error"


async def test_a_prefixed_name_longer_than_64_characters_is_an_invalid_spec_naming_the_tool() -> None:
    server = MCPServer("long")

    @server.tool(name="t" * 60)
    def long_tool() -> str:
        """Too long once prefixed."""
        return "x"

    async with mcp_serving(server) as running:
        with pytest.raises(InvalidToolSpec) as caught:
            async with open_tools(_spec({"name": "longserver", "url": running.url}), StaticEnvironment()):
                pass
    message = str(caught.value)
    assert "spec.tools[0].mcp" in message and f"longserver_{'t' * 60}" in message


async def test_a_prefixed_name_colliding_with_another_tool_is_an_invalid_spec(mcp: RunningMCP) -> None:
    spec = AgentRunSpec.model_validate(
        {
            "task": "t",
            "tools": [
                {"http": {"name": "inv_reserve", "description": "d", "url": "http://127.0.0.1:9/"}},
                {"mcp": {"name": "inv", "url": mcp.url}},
            ],
        }
    )
    with pytest.raises(InvalidToolSpec, match=r"spec\.tools\[1\]: duplicate tool name 'inv_reserve'"):
        async with open_tools(spec, StaticEnvironment()):
            pass


async def test_headers_from_a_secret_reach_the_mcp_server(mcp: RunningMCP) -> None:
    env = StaticEnvironment(secrets={("mcp-auth", "headers"): '{"X-Api-Token": "tok-123"}'})
    spec = _spec({"name": "inv", "url": mcp.url, "headersFrom": {"name": "mcp-auth", "key": "headers"}})
    async with open_tools(spec, env) as tools:
        await tools["inv_count_items"].call(_call("inv_count_items", {"warehouse": "south"}))
    assert mcp.recorder.headers and all(h.get("x-api-token") == "tok-123" for h in mcp.recorder.headers)


async def test_an_unreachable_server_is_retried_a_bounded_number_of_times_then_fails_the_start() -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    spec = _spec({"name": "inv", "url": "http://127.0.0.1:9/mcp"})
    with pytest.raises(ToolStartError) as caught:
        async with open_tools(spec, StaticEnvironment(), sleep=sleep):
            pass
    assert sleeps == [1.0, 2.0, 4.0]
    message = str(caught.value)
    assert "spec.tools[0].mcp" in message and "'inv'" in message and "after 4 attempts" in message


async def test_a_server_that_restarts_mid_run_is_reconnected_on_the_next_call() -> None:
    async with mcp_serving() as first:
        port = int(first.url.rsplit(":", 1)[1].split("/")[0])
        spec = _spec({"name": "inv", "url": first.url})
        async with open_tools(spec, StaticEnvironment()) as tools:
            tool = tools["inv_count_items"]
            assert (await tool.call(_call("inv_count_items", {"warehouse": "north"}))).content == "17"
            first.server.should_exit = True
            await first.server.shutdown()
            with pytest.raises(ToolError) as caught:
                await tool.call(_call("inv_count_items", {"warehouse": "north"}))
            assert caught.value.code == "unavailable" and caught.value.recoverable
            async with mcp_serving(port=port):
                assert (await tool.call(_call("inv_count_items", {"warehouse": "south"}))).content == "4"
