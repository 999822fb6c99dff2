"""A run's model and tools, asked first whether this replica still holds the run (controller/replicas/).

Why at these ports: they are where a step of the run reaches outside the operator (a model request
that is billed, a tool call that acts), and the pure loop must not know about replicas. Writes have
their seam already: the transcript store and the status writer ask ``stopping()`` before each attempt,
and the reconciler folds the same check into it.

``held()`` stops the run when it says no (a supervisor stop: the run's task is cancelled); the step is
then not taken, and the cancellation arrives right here, where nothing has been sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from agentrun.loop.protocols import (
    ModelClient,
    ModelRequest,
    ModelResponse,
    Tool,
    ToolCall,
    ToolDefinition,
    ToolOutput,
)

__all__ = ["HeldModel", "HeldTool", "held_tools"]


async def _not_held() -> None:
    # held() cancelled the run's task: let that cancellation land before the step (a tool call in a
    # task of its own is cancelled with its run, as the loop awaits it).
    await asyncio.sleep(0)
    raise asyncio.CancelledError("this replica no longer holds the run")


class HeldModel:
    """The run's model client, which sends nothing once the run is no longer this replica's."""

    __slots__ = ("_held", "_model")

    def __init__(self, model: ModelClient, held: Callable[[], bool]) -> None:
        self._model = model
        self._held = held

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if not self._held():
            await _not_held()
        return await self._model.complete(request)


class HeldTool:
    """One of the run's tools, which acts no more once the run is no longer this replica's."""

    __slots__ = ("_held", "_tool")

    def __init__(self, tool: Tool, held: Callable[[], bool]) -> None:
        self._tool = tool
        self._held = held

    @property
    def definition(self) -> ToolDefinition:
        return self._tool.definition

    async def call(self, call: ToolCall) -> ToolOutput:
        if not self._held():
            await _not_held()
        return await self._tool.call(call)


def held_tools(tools: Mapping[str, Tool], held: Callable[[], bool]) -> dict[str, Tool]:
    return {name: HeldTool(tool, held) for name, tool in tools.items()}
