"""Turning spec.tools into the run's fixed tool set, or a precise error naming the offending field.

Two stages, because the controller must wait for Secrets in between:
* `check_tools(spec)`: everything knowable from the spec alone (bad built-in config,
  invalid inputSchema, duplicate names), raising InvalidToolSpec before the run starts;
* `open_tools(spec, env)`: reads header Secrets, lists MCP servers and reads A2A Agent Cards (once:
  the list is part of the cached prompt prefix and stays fixed for the run), and closes connections
  when the run ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrun.api.sandbox_spec import SANDBOX_TOOL_NAMES
from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.spec_base import TOOL_NAME_PATTERN
from agentrun.api.tool_specs import MCPServer, ToolSpec
from agentrun.loop.protocols import Tool, ToolCall, ToolDefinition, ToolOutput
from agentrun.tools.a2a_calling import open_remote
from agentrun.tools.agent_calling import AgentTool
from agentrun.tools.builtin.basic import Calculator, CurrentTime
from agentrun.tools.builtin.http_fetch import FetchConfig, HTTPFetch
from agentrun.tools.builtin.kubernetes import CLUSTER_SCOPED_CAPABLE, KUBERNETES_TOOLS, Scope
from agentrun.tools.environment import (
    MountMissing,
    MountUse,
    SecretMissing,
    SecretUse,
    ToolEnvironment,
    ToolStartError,
)
from agentrun.tools.errors import InvalidToolSpec
from agentrun.tools.kube_reading import KubeReader, service_account_user
from agentrun.tools.sandbox.tools import sandbox_tools
from agentrun.tools.secret_headers import read_headers
from agentrun.tools.webhooking import WebhookTool, check_schema, endpoint

__all__ = [
    "BUILTIN_NAMES",
    "InvalidToolSpec",
    "MountMissing",
    "MountUse",
    "SecretMissing",
    "ToolStartError",
    "check_tools",
    "mount_uses",
    "open_tools",
    "secret_uses",
]

if TYPE_CHECKING:
    from agentrun.tools.mcp_calling import MCPSession

Sleep = Callable[[float], Awaitable[None]]
MCP_START_DELAYS = (1.0, 2.0, 4.0)  # 4 attempts over about 7 s, then the run fails

_SIMPLE: dict[str, Callable[[Mapping[str, Any]], Tool]] = {
    "current_time": CurrentTime,
    "calculator": Calculator,
    "http_fetch": HTTPFetch,
}
BUILTIN_NAMES = tuple(sorted((*_SIMPLE, *KUBERNETES_TOOLS)))


def _check_builtin(name: str, config: Mapping[str, Any]) -> None:
    if name in KUBERNETES_TOOLS:
        Scope.parse(config, "", cluster_scoped_key=name in CLUSTER_SCOPED_CAPABLE)
    elif name == "http_fetch":
        FetchConfig.parse(config)
    else:
        _SIMPLE[name](config)


def check_tools(spec: AgentRunSpec) -> None:
    """Everything that can be checked without Secrets or servers; raises InvalidToolSpec."""
    names: dict[str, str] = {}
    servers: dict[str, str] = {}
    mcp_prefixes = [f"{t.mcp.name}_" for t in spec.tools if t.mcp is not None]
    for index, entry in enumerate(spec.tools):
        where = f"spec.tools[{index}]"
        if entry.builtin is not None:
            # An unknown name never gets here: the CRD's enum (api/tool_specs.py) refuses it.
            try:
                _check_builtin(entry.builtin.name, entry.builtin.config)
            except ValueError as exc:
                raise InvalidToolSpec(f"{where}.builtin.config: {entry.builtin.name}: {exc}") from exc
            _claim(names, entry.builtin.name, where)
        elif entry.http is not None:
            if (entry.http.url is None) == (entry.http.service is None):
                raise InvalidToolSpec(f"{where}.http: set exactly one of url and service")
            problem = check_schema(entry.http.input_schema)
            if problem is not None:
                raise InvalidToolSpec(f"{where}.http.inputSchema: not a valid JSON Schema: {problem}")
            _claim(names, entry.http.name, where)
        elif entry.mcp is not None:
            if entry.mcp.name in servers:
                raise InvalidToolSpec(
                    f"{where}.mcp.name: duplicate MCP server name {entry.mcp.name!r} "
                    f"(also {servers[entry.mcp.name]})"
                )
            servers[entry.mcp.name] = where
        elif entry.agent is not None:
            _claim(names, entry.agent.name, where)
        elif entry.a2a is not None:
            _claim(names, entry.a2a.name, where)
    if spec.sandbox is not None:
        for name in SANDBOX_TOOL_NAMES:
            _claim(names, name, "spec.sandbox")
    _check_references(spec, set(names), mcp_prefixes)


def _claim(names: dict[str, str], name: str, where: str) -> None:
    if name in names:
        raise InvalidToolSpec(f"{where}: duplicate tool name {name!r} (also {names[name]})")
    names[name] = where


def _check_references(spec: AgentRunSpec, names: set[str], mcp_prefixes: list[str]) -> None:
    def known(name: str) -> bool:
        return name in names or any(name.startswith(p) for p in mcp_prefixes)

    for name in spec.required_tools:
        if not known(name):
            raise InvalidToolSpec(f"spec.requiredTools: {name!r} is not one of the run's tools")
    choice = spec.tool_choice
    if choice is not None and choice.name and not known(choice.name):
        raise InvalidToolSpec(f"spec.toolChoice.name: {choice.name!r} is not one of the run's tools")
    if choice is not None and choice.type in ("any", "tool") and not spec.tools:
        raise InvalidToolSpec(f"spec.toolChoice.type: {choice.type!r} needs at least one tool")


def secret_uses(spec: AgentRunSpec) -> list[SecretUse]:
    """The Secrets the tools read, each with the field that references it."""
    uses: list[SecretUse] = []
    for index, entry in enumerate(spec.tools):
        if entry.http is not None and entry.http.headers_from is not None:
            uses.append(SecretUse(f"spec.tools[{index}].http.headersFrom", entry.http.headers_from))
        if entry.mcp is not None and entry.mcp.headers_from is not None:
            uses.append(SecretUse(f"spec.tools[{index}].mcp.headersFrom", entry.mcp.headers_from))
        if entry.a2a is not None and entry.a2a.headers_from is not None:
            uses.append(SecretUse(f"spec.tools[{index}].a2a.headersFrom", entry.a2a.headers_from))
    # Read by the kubelet, but waited for like the others: a missing one would stop the pod's start.
    for index, env in enumerate(spec.sandbox.env if spec.sandbox is not None else []):
        if env.secret_key_ref is not None:
            uses.append(SecretUse(f"spec.sandbox.env[{index}].secretKeyRef", env.secret_key_ref))
    return uses


def mount_uses(spec: AgentRunSpec) -> list[MountUse]:
    """The Secrets and ConfigMaps the sandbox's volumes mount, each with the field that names it."""
    uses: list[MountUse] = []
    for index, volume in enumerate(spec.sandbox.volumes if spec.sandbox is not None else []):
        if volume.secret is not None:
            field = f"spec.sandbox.volumes[{index}].secret"
            uses.append(MountUse(field, "Secret", volume.secret.secret_name))
        if volume.config_map is not None:
            field = f"spec.sandbox.volumes[{index}].configMap"
            uses.append(MountUse(field, "ConfigMap", volume.config_map.name))
    return uses


@dataclass
class _Declared:
    """A tool with the spec entry's writeKey and requiresApproval applied to its definition."""

    inner: Tool
    definition: ToolDefinition

    async def call(self, call: ToolCall) -> ToolOutput:
        return await self.inner.call(call)


def _declared(tool: Tool, entry: ToolSpec) -> Tool:
    if entry.write_key is None and not entry.requires_approval:
        return tool
    definition = dataclasses.replace(
        tool.definition, write_key=entry.write_key, requires_approval=entry.requires_approval
    )
    return _Declared(tool, definition)


@contextlib.asynccontextmanager
async def open_tools(
    spec: ResolvedRunSpec,
    env: ToolEnvironment,
    *,
    sleep: Sleep = asyncio.sleep,
    mcp_start_delays: tuple[float, ...] = MCP_START_DELAYS,
) -> AsyncIterator[dict[str, Tool]]:
    """The run's tools, open for the duration of the block.

    Raises InvalidToolSpec (a name collision after MCP prefixing, a malformed header Secret,
    a Kubernetes tool without a cluster), SecretMissing, or ToolStartError (an MCP server still
    unreachable after the start retries).
    """
    check_tools(spec)
    async with contextlib.AsyncExitStack() as stack:
        tools: dict[str, Tool] = {}
        reader: KubeReader | None = None

        def kube_reader(where: str) -> KubeReader:
            """One reader for every Kubernetes tool of the run, opened by the first of them."""
            nonlocal reader
            if reader is None:
                reader = _kube_reader(env, where)
                stack.push_async_callback(reader.close)
            return reader

        for index, entry in enumerate(spec.tools):
            where = f"spec.tools[{index}]"
            for tool in await _entry_tools(entry, where, env, stack, kube_reader, sleep, mcp_start_delays):
                _add(tools, _declared(tool, entry), where)
        if spec.sandbox is not None:
            sandbox = env.sandbox(spec.sandbox)
            if sandbox is None:
                raise InvalidToolSpec(
                    "spec.sandbox: a sandbox is a pod the operator starts in the run's namespace, "
                    "which `agentrun run` cannot do"
                )
            for tool in sandbox_tools(sandbox):
                if tool.definition.name in spec.sandbox.requires_approval:
                    tool = _Declared(tool, dataclasses.replace(tool.definition, requires_approval=True))
                _add(tools, tool, "spec.sandbox")
        for required in spec.required_tools:
            if required not in tools:
                raise InvalidToolSpec(f"spec.requiredTools: {required!r} is not one of the run's tools")
        if spec.tool_choice is not None and spec.tool_choice.name and spec.tool_choice.name not in tools:
            raise InvalidToolSpec(
                f"spec.toolChoice.name: {spec.tool_choice.name!r} is not one of the run's tools"
            )
        yield tools


async def _entry_tools(
    entry: ToolSpec,
    where: str,
    env: ToolEnvironment,
    stack: contextlib.AsyncExitStack,
    kube_reader: Callable[[str], KubeReader],
    sleep: Sleep,
    mcp_start_delays: tuple[float, ...],
) -> list[Tool]:
    """The tools one entry of spec.tools declares (an MCP server: all it lists), open until ``stack``
    closes."""
    if entry.builtin is not None:
        name, config = entry.builtin.name, entry.builtin.config
        if name in KUBERNETES_TOOLS:
            reader = kube_reader(where)
            scope = Scope.parse(config, env.namespace, cluster_scoped_key=name in CLUSTER_SCOPED_CAPABLE)
            return [KUBERNETES_TOOLS[name](reader, scope)]
        return [_SIMPLE[name](config)]
    if entry.http is not None:
        use = (
            SecretUse(f"{where}.http.headersFrom", entry.http.headers_from)
            if entry.http.headers_from
            else None
        )
        webhook = WebhookTool(
            entry.http,
            url=endpoint(entry.http, env.namespace),
            headers=await read_headers(env, use),
            sleep=sleep,
            definition=ToolDefinition(entry.http.name, entry.http.description, entry.http.input_schema),
        )
        return [webhook]
    if entry.mcp is not None:
        use = (
            SecretUse(f"{where}.mcp.headersFrom", entry.mcp.headers_from) if entry.mcp.headers_from else None
        )
        # Imported on first use: the MCP SDK takes seconds to import and most runs have no MCP server.
        from agentrun.tools.mcp_calling import MCPSession

        session = MCPSession(entry.mcp.url, await read_headers(env, use))
        stack.push_async_callback(session.close)
        return await _mcp_tools(session, entry.mcp, where, sleep, mcp_start_delays)
    if entry.agent is not None:
        children = env.child_runs()
        if children is None:
            raise InvalidToolSpec(
                f"{where}.agent: agent tools run child AgentRuns, which only the operator can "
                "create (not `agentrun run`)"
            )
        return [AgentTool(entry.agent, children)]
    if entry.a2a is not None:
        a2a = entry.a2a
        use = SecretUse(f"{where}.a2a.headersFrom", a2a.headers_from) if a2a.headers_from else None
        headers = await read_headers(env, use)
        return [await open_remote(a2a, headers, where, stack, sleep=sleep, start_delays=mcp_start_delays)]
    return []


def _kube_reader(env: ToolEnvironment, where: str) -> KubeReader:
    connection = env.kube_connection()
    if connection is None:
        raise InvalidToolSpec(
            f"{where}.builtin: Kubernetes tools need a cluster, and none is configured "
            "(set KUBECONFIG when running locally)"
        )
    return KubeReader(connection, user=service_account_user(env.namespace, env.service_account_name))


async def _mcp_tools(
    session: MCPSession, server: MCPServer, where: str, sleep: Sleep, delays: tuple[float, ...]
) -> list[Tool]:
    from agentrun.tools.mcp_calling import MCPTool, describe

    attempts = len(delays) + 1
    for attempt in range(attempts):
        try:
            listed = await session.list_tools()
            break
        except Exception as exc:  # any transport or protocol failure: retried, then reported
            await session.broken()
            if attempt + 1 == attempts:
                raise ToolStartError(
                    f"{where}.mcp: MCP server {server.name!r} at {server.url} could not be listed after "
                    f"{attempts} attempts: {describe(exc)}"
                ) from None
            await sleep(delays[attempt])
    offered = {tool.name: tool for tool in listed}
    wanted = list(offered) if server.allowed_tools is None else server.allowed_tools
    missing = [name for name in wanted if name not in offered]
    if missing:
        raise InvalidToolSpec(
            f"{where}.mcp.allowedTools: server {server.name!r} does not offer {', '.join(missing)} "
            f"(it offers: {', '.join(sorted(offered)) or 'nothing'})"
        )
    tools: list[Tool] = []
    for name in wanted:
        remote = offered[name]
        prefixed = f"{server.name}_{name}"
        if not re.match(TOOL_NAME_PATTERN, prefixed):
            raise InvalidToolSpec(
                f"{where}.mcp: tool {name!r} of server {server.name!r} becomes {prefixed!r}, which does not "
                f"match {TOOL_NAME_PATTERN}; exclude it with allowedTools or shorten the server name"
            )
        definition = ToolDefinition(
            name=prefixed,
            description=remote.description or remote.title or name,
            input_schema=remote.input_schema,
        )
        tools.append(MCPTool(session, remote_name=name, definition=definition))
    return tools


def _add(tools: dict[str, Tool], tool: Tool, where: str) -> None:
    name = tool.definition.name
    if not re.match(TOOL_NAME_PATTERN, name):
        raise InvalidToolSpec(f"{where}: tool name {name!r} does not match {TOOL_NAME_PATTERN}")
    if name in tools:
        raise InvalidToolSpec(f"{where}: duplicate tool name {name!r}")
    tools[name] = tool
