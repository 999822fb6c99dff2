"""Running one turn's tool calls: parallel under a cap, results in call order, errors as results.

A tool failure never escapes as an exception: the model must see an is_error tool_result for
every tool_use id, or the next request is rejected by the API and the model never learns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentrun.api.traces import ToolTrace
from agentrun.api.usage import TokenUsage
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import Block, Clock, Tool, ToolCall, ToolOutput
from agentrun.loop.state import content_hash

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolOutcome:
    block: Block  # the tool_result block, ready for the history
    trace: ToolTrace
    fatal: bool
    result_hash: str
    usage_by_model: Mapping[str, TokenUsage] = field(default_factory=dict)
    # A non-recoverable error's own message: the run's status says why it ended, not only its code.
    fatal_message: str = ""


def error_output(error: ToolError) -> ToolOutput:
    return ToolOutput(content=json.dumps(error.as_payload()), is_error=True, structured=error.as_payload())


def cut(text: str, limit: int) -> str:
    """Cut long results visibly, so the model knows it did not see everything."""
    if len(text) <= limit:
        return text
    dropped = len(text) - limit
    return f"{text[:limit]}\n[... {dropped} more characters cut by the operator (maxToolResultChars={limit})]"


class Dispatcher:
    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        clock: Clock,
        concurrency: int,
        timeout_seconds: float,
        max_result_chars: int,
    ) -> None:
        self._tools = tools
        self._clock = clock
        self._semaphore = asyncio.Semaphore(concurrency)
        self._timeout = timeout_seconds
        self._max_chars = max_result_chars
        self._write_locks: dict[str, asyncio.Lock] = {}

    async def run(self, calls: Sequence[ToolCall], rejected: Mapping[str, ToolError]) -> list[ToolOutcome]:
        """Run calls concurrently; `rejected` ids are answered with their error without running."""
        tasks = [asyncio.ensure_future(self._one(call, rejected.get(call.id))) for call in calls]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()
            # Cancellation of the whole turn (run timeout, cancel) must not leave orphans running.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, call: ToolCall, rejection: ToolError | None) -> ToolOutcome:
        started = self._clock.monotonic()
        if rejection is not None:
            output = error_output(rejection)
        else:
            output = await self._execute(call)
        duration = self._clock.monotonic() - started
        code = str(output.structured.get("code")) if output.is_error and output.structured else None
        fatal = bool(output.is_error and output.structured.get("recoverable") is False)
        content = cut(output.content, self._max_chars)
        block: Block = {"type": "tool_result", "tool_use_id": call.id, "content": content}
        if output.is_error:
            block["is_error"] = True
        trace = ToolTrace(
            call.id, call.name, content_hash(dict(call.input)), duration, not output.is_error, code
        )
        said = "; ".join(str(output.structured.get(k) or "") for k in ("message", "hint")).strip("; ")
        said = said if fatal else ""
        return ToolOutcome(block, trace, fatal, content_hash(output.content), output.usage_by_model, said)

    async def _execute(self, call: ToolCall) -> ToolOutput:
        tool = self._tools[call.name]
        write_key = tool.definition.write_key
        lock = self._write_locks.setdefault(write_key, asyncio.Lock()) if write_key else None
        async with contextlib.AsyncExitStack() as stack:
            if lock is not None:
                await stack.enter_async_context(lock)
            await stack.enter_async_context(self._semaphore)
            limit = tool.definition.timeout_seconds
            limit = self._timeout if limit is None else limit
            try:
                return await asyncio.wait_for(tool.call(call), timeout=None if math.isinf(limit) else limit)
            except ToolError as exc:
                return error_output(exc)
            except TimeoutError:
                return error_output(
                    ToolError(
                        "timeout",
                        f"tool {call.name} did not answer within {limit:g}s",
                        hint="retry with a smaller request, or use another tool",
                    )
                )
            except Exception:
                # The stack trace belongs in logs and the trace, never in the model's history.
                logger.exception("tool %s failed (tool_use_id=%s)", call.name, call.id)
                return error_output(
                    ToolError(
                        "internal_error", f"tool {call.name} failed unexpectedly", hint="try again later"
                    )
                )
        raise AssertionError("unreachable")  # pragma: no cover
