"""spec.tools → the run's tool set: static checks, Secret references, per-entry settings."""

from __future__ import annotations

from typing import Any, get_args

import pydantic
import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.api.tool_specs import BuiltinToolName
from agentrun.tools.errors import InvalidToolSpec
from agentrun.tools.registry import BUILTIN_NAMES, check_tools, open_tools, secret_uses
from tests.unit.tools.environment import LocalSandbox, StaticEnvironment


def _spec(tools: list[dict[str, Any]], **extra: Any) -> AgentRunSpec:
    return AgentRunSpec.model_validate({"task": "t", "tools": tools, **extra})


def test_an_unknown_builtin_is_refused_by_the_spec_listing_the_known_ones() -> None:
    """The same enum is in the CRD: the API server refuses the name when the run is applied."""
    with pytest.raises(pydantic.ValidationError) as caught:
        _spec([{"builtin": {"name": "kubectl_delete"}}])
    message = str(caught.value)
    assert "tools.0.builtin.name" in message and "kubernetes_get" in message and "http_fetch" in message


def test_the_crd_enum_of_builtin_names_is_exactly_the_implemented_tools() -> None:
    assert get_args(BuiltinToolName) == BUILTIN_NAMES


def test_duplicate_names_are_rejected_naming_both_entries() -> None:
    webhook = {"name": "calculator", "description": "d", "url": "http://h/"}
    with pytest.raises(
        InvalidToolSpec, match=r"spec\.tools\[1\]: duplicate tool name 'calculator' \(also spec\.tools\[0\]\)"
    ):
        check_tools(_spec([{"builtin": {"name": "calculator"}}, {"http": webhook}]))


def test_required_tools_may_name_tools_of_an_mcp_server_before_it_is_listed() -> None:
    tools = [{"mcp": {"name": "inv", "url": "http://h/mcp"}}]
    check_tools(_spec(tools, requiredTools=["inv_count_items"]))
    with pytest.raises(InvalidToolSpec, match=r"spec\.requiredTools: 'other_x'"):
        check_tools(_spec(tools, requiredTools=["other_x"]))


def test_secret_uses_name_the_field_of_each_reference() -> None:
    spec = _spec(
        [
            {"builtin": {"name": "calculator"}},
            {
                "http": {
                    "name": "w",
                    "description": "d",
                    "url": "http://h/",
                    "headersFrom": {"name": "a", "key": "k"},
                }
            },
            {"mcp": {"name": "m", "url": "http://h/mcp", "headersFrom": {"name": "b"}}},
        ]
    )
    assert [(u.field, u.ref.name, u.ref.key) for u in secret_uses(spec)] == [
        ("spec.tools[1].http.headersFrom", "a", "k"),
        ("spec.tools[2].mcp.headersFrom", "b", "api-key"),
    ]


async def test_write_key_and_requires_approval_reach_the_tool_definition() -> None:
    spec = _spec(
        [
            {"builtin": {"name": "calculator"}, "writeKey": "math", "requiresApproval": True},
            {"builtin": {"name": "current_time"}},
        ]
    )
    async with open_tools(spec, StaticEnvironment()) as tools:
        calculator, clock = tools["calculator"].definition, tools["current_time"].definition
    assert (calculator.write_key, calculator.requires_approval) == ("math", True)
    assert (clock.write_key, clock.requires_approval) == (None, False)


async def test_open_tools_reads_no_secret_when_none_is_referenced() -> None:
    env = StaticEnvironment()
    async with open_tools(_spec([{"builtin": {"name": "calculator"}}]), env) as tools:
        assert list(tools) == ["calculator"]
    assert env.reads == []


def test_two_mcp_servers_with_the_same_name_are_rejected() -> None:
    server = {"name": "docs", "url": "http://h/mcp"}
    with pytest.raises(
        InvalidToolSpec, match=r"spec\.tools\[1\]\.mcp\.name: duplicate MCP server name 'docs'"
    ):
        check_tools(_spec([{"mcp": server}, {"mcp": server}]))


SANDBOX = {
    "image": "localhost/agentrun-sandbox:dev",
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
}


async def test_a_sandbox_gives_bash_and_the_editor_and_the_ones_named_wait_for_approval(
    tmp_path: Any,
) -> None:
    spec = _spec([], sandbox={**SANDBOX, "requiresApproval": ["bash"]})
    async with open_tools(spec, StaticEnvironment(sandboxed=LocalSandbox(tmp_path))) as tools:
        assert sorted(tools) == ["bash", "str_replace_based_edit_tool"]
        assert tools["bash"].definition.requires_approval
        assert tools["bash"].definition.api_type == "bash_20250124"
        assert not tools["str_replace_based_edit_tool"].definition.requires_approval


async def test_a_sandbox_where_no_operator_can_start_one_is_a_clear_error() -> None:
    with pytest.raises(InvalidToolSpec, match=r"spec\.sandbox: a sandbox is a pod the operator starts"):
        async with open_tools(_spec([], sandbox=SANDBOX), StaticEnvironment()):
            pass


def test_a_sandbox_env_secret_is_waited_for_like_the_tools_secrets() -> None:
    env = [{"name": "TOKEN", "secretKeyRef": {"name": "git", "key": "token"}}, {"name": "CI", "value": "1"}]
    uses = secret_uses(_spec([], sandbox={**SANDBOX, "env": env}))
    assert [(u.field, u.ref.name, u.ref.key) for u in uses] == [
        ("spec.sandbox.env[0].secretKeyRef", "git", "token")
    ]
