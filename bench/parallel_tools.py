"""Benchmark 2: one turn asks for N tool calls of D seconds each; the tool phase should take about D.

Real ``asyncio.sleep`` tools run through our loop and Dispatcher with the real SDK against the fake
Messages API. The tool phase is timed by an observer, from the checkpoint the loop writes once the model's
tool_use turn is stored (``tools_pending``) to the checkpoint that carries the turn's trace (all results in),
so it covers dispatch, every call, result assembly and nothing of the model's round trips.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import StopReason
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.events import Checkpoint, Event
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.loop.running import run_loop
from agentrun.model.access import ModelAccess
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI
from bench.conversation import API_KEY, MAX_TOKENS, MODEL, task, tool_turns_script
from bench.figures import Figure, Section, Target, median, progress

MARKER = "[bench:parallel]"


@dataclass(frozen=True)
class SleepTool:
    name: str
    seconds: float

    @property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            name=self.name,
            description=f"Waits {self.seconds:g}s like a slow API, then answers.",
            input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        await asyncio.sleep(self.seconds)
        return ToolOutput(f"{self.name}({call.input.get('q')}) = ok")


@dataclass
class ToolPhaseTimer:
    started: float | None = None
    phases: list[float] = field(default_factory=list)

    async def notify(self, event: Event) -> None:
        if not isinstance(event, Checkpoint):
            return
        if event.tools_pending:
            self.started = time.perf_counter()
        elif event.trace is not None and event.trace.tool_calls and self.started is not None:
            self.phases.append(time.perf_counter() - self.started)
            self.started = None


async def measure(section: Section, *, repeats: int, calls: int, seconds: float) -> None:
    script = tool_turns_script(MARKER, turns=1, calls=calls, tool_names=("slow",))
    spec = AgentRunSpec.model_validate(
        {"task": task(MARKER), "model": {"name": MODEL, "maxTokens": MAX_TOKENS}}
    )
    config = LoopConfig.from_spec(spec, run_id="bench-parallel")
    tools = {"slow": SleepTool("slow", seconds)}
    timer = ToolPhaseTimer()
    progress(f"parallel: {repeats} turns of {calls} × {seconds:g} s tools")
    async with FakeMessagesAPI(scripts=[script], demo_brain=False).running() as server:
        pool = ClientPool()
        for attempt in range(repeats + 1):  # the first run warms up and is not counted
            outcome = await run_loop(
                config,
                model=pool.model(ModelAccess(api_key=API_KEY, base_url=server.url)),
                tools=tools,
                observer=timer,
                clock=SystemClock(),
                pricer=PriceTable(),
                cancel=asyncio.Event(),
            )
            if outcome.stop_reason is not StopReason.END_TURN:
                raise RuntimeError(f"parallel-tools run ended with {outcome.stop_reason}: {outcome.message}")
            if attempt == 0:
                timer.phases.clear()
        await pool.close()
    phases = timer.phases
    section.add(
        Figure(
            f"tool phase ÷ one tool's latency ({calls} calls × {seconds * 1000:.0f} ms)",
            median(phases) / seconds,
            "×",
            len(phases),
            Target(1.15),
        )
    )
    section.add(Figure("tool phase", median(phases) * 1000, "ms", len(phases)))
    section.notes.append(
        f"limits.toolConcurrency is the default ({config.limits.tool_concurrency}); "
        f"{calls} calls run at once."
    )
