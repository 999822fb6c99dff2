"""Turning spec.tools into the run's fixed tool set, or a precise InvalidSpec message."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.api.spec import TOOL_NAME_PATTERN, AgentRunSpec
from agentrun.loop.protocols import Tool
from agentrun.tools.builtin.basic import Calculator, CurrentTime

BUILTINS: dict[str, Callable[[Mapping[str, Any]], Tool]] = {
    "current_time": CurrentTime,
    "calculator": Calculator,
}


class InvalidToolSpec(ValueError):
    """The spec's tools cannot form a valid tool set; the message names the offending tool."""


def build_tools(spec: AgentRunSpec) -> dict[str, Tool]:
    tools: dict[str, Tool] = {}
    for index, entry in enumerate(spec.tools):
        where = f"spec.tools[{index}]"
        if entry.builtin is not None:
            factory = BUILTINS.get(entry.builtin.name)
            if factory is None:
                known = ", ".join(sorted(BUILTINS))
                raise InvalidToolSpec(
                    f"{where}.builtin.name: unknown built-in {entry.builtin.name!r} (known: {known})"
                )
            try:
                tool = factory(entry.builtin.config)
            except ValueError as exc:
                raise InvalidToolSpec(f"{where}.builtin.config: {exc}") from exc
        else:
            kind = "http" if entry.http is not None else "mcp"
            raise InvalidToolSpec(f"{where}.{kind}: {kind} tools are not supported by this operator version")
        _add(tools, tool, where)
    for name in spec.required_tools:
        if name not in tools:
            raise InvalidToolSpec(f"spec.requiredTools: {name!r} is not one of the run's tools")
    if spec.tool_choice is not None and spec.tool_choice.name and spec.tool_choice.name not in tools:
        raise InvalidToolSpec(
            f"spec.toolChoice.name: {spec.tool_choice.name!r} is not one of the run's tools"
        )
    if spec.tool_choice is not None and spec.tool_choice.type in ("any", "tool") and not tools:
        raise InvalidToolSpec(f"spec.toolChoice.type: {spec.tool_choice.type!r} needs at least one tool")
    return tools


def _add(tools: dict[str, Tool], tool: Tool, where: str) -> None:
    name = tool.definition.name
    if not re.match(TOOL_NAME_PATTERN, name):
        raise InvalidToolSpec(f"{where}: tool name {name!r} does not match {TOOL_NAME_PATTERN}")
    if name in tools:
        raise InvalidToolSpec(f"{where}: duplicate tool name {name!r}")
    tools[name] = tool
