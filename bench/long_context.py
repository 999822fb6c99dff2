"""Benchmark 5: a long run with big tool results, with and without context management and caching.

One run of N tool turns, each reading a 20 KB result (a pod log), on a 200,000-token window: the
pure loop with the real SDK and adapter against the fake Messages API, which counts one token per 4
characters, refuses any request above the window as the real API does ("prompt is too long") and,
where asked, keeps a prompt cache as the real API does. Per iteration we record the request's
input-side tokens (uncached + cache reads + cache writes, what fills the window) and its full-price
input tokens (uncached + cache writes: what is not read from the cache at a tenth of the price).
Configurations: context management off; the defaults (clearing old results, compaction at 80%);
compaction alone (clearing off); each of the last two with and without the server's prompt cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anthropic

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import StopReason
from agentrun.api.traces import COMPACTION
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig
from agentrun.loop.events import Checkpoint, ContextCompacted, Event
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.loop.running import run_loop
from agentrun.model.anthropic_calling import AnthropicModel
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from bench.conversation import API_KEY, MODEL
from bench.figures import Figure, Section, Target, progress

MARKER = "[bench:context]"
WINDOW = 200_000
RESULT_CHARS = 20_000


@dataclass(frozen=True)
class Config:
    label: str
    context: Mapping[str, Any]
    prompt_cache: bool


CONFIGS = (
    Config(
        "management off", {"clearToolResults": {"enabled": False}, "compaction": {"enabled": False}}, True
    ),
    Config("defaults, cache", {}, True),
    Config("defaults, no cache", {}, False),
    Config("compaction only, cache", {"clearToolResults": {"enabled": False}}, True),
    Config("compaction only, no cache", {"clearToolResults": {"enabled": False}}, False),
)


@dataclass
class LogTool:
    """Answers each call with a distinct log of `size` characters."""

    size: int

    @property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(
            "pod_logs",
            "Returns the log of a pod.",
            {"type": "object", "properties": {"pod": {"type": "string"}}},
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        pod = str(call.input.get("pod"))
        line = f"{pod} 2026-11-24T07:00:00Z GET /healthz 200 1ms\n"
        return ToolOutput((line * (self.size // len(line) + 1))[: self.size])


@dataclass
class Record:
    """Per iteration (index i: iteration i+1): input-side and full-price input tokens."""

    prompt: list[int] = field(default_factory=list)
    full_price: list[int] = field(default_factory=list)
    compactions: int = 0
    summary_tokens: int = 0

    async def notify(self, event: Event) -> None:
        match event:
            case Checkpoint(trace=row) if row is not None:
                u = row.usage
                if row.stop_reason == COMPACTION:
                    self.summary_tokens += u.total
                    return
                self.prompt.append(u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens)
                self.full_price.append(u.input_tokens + u.cache_creation_input_tokens)
            case ContextCompacted():
                self.compactions += 1
            case _:
                pass


@dataclass(frozen=True)
class Outcome:
    config: Config
    stop_reason: StopReason
    message: str
    record: Record
    seconds: float


async def one_run(config: Config, iterations: int, result_chars: int) -> Outcome:
    steps = [Reply([tool_use_block("pod_logs", {"pod": f"web-{i}"})]) for i in range(iterations)]
    steps.append(Reply([text_block("Every pod answered its health checks.")]))
    script = Script(MARKER, steps, context_window=WINDOW)
    api = FakeMessagesAPI(scripts=[script], demo_brain=False, prompt_cache=config.prompt_cache)
    spec = AgentRunSpec.model_validate(
        {
            "task": f"{MARKER} Read the log of every web pod and report.",
            "model": {"name": MODEL, "maxTokens": 1024},
            "limits": {
                "maxIterations": iterations + 5,
                "maxToolResultChars": result_chars,
                "timeoutSeconds": 3600,
            },
            "context": dict(config.context),
        }
    )
    record = Record()
    started = time.perf_counter()
    async with api.running() as server:
        client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=server.url, max_retries=0, timeout=60)
        try:
            outcome = await run_loop(
                LoopConfig.from_spec(spec, run_id="bench-context"),
                model=AnthropicModel(client),
                tools={"pod_logs": LogTool(result_chars)},
                observer=record,
                clock=SystemClock(),
                pricer=PriceTable(),
                cancel=asyncio.Event(),
            )
        finally:
            await client.close()
    return Outcome(config, outcome.stop_reason, outcome.message, record, time.perf_counter() - started)


def _mean(values: list[int]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _at(values: list[int], iteration: int) -> str:
    return f"{values[iteration - 1]:,}" if 0 < iteration <= len(values) else "—"


async def measure(section: Section, *, iterations: int, result_chars: int = RESULT_CHARS) -> None:
    progress(
        f"context: {len(CONFIGS)} runs of {iterations} iterations with {result_chars:,}-character results"
    )
    outcomes = [await one_run(config, iterations, result_chars) for config in CONFIGS]
    by_label = {o.config.label: o for o in outcomes}
    managed = by_label["defaults, cache"]
    section.add(
        Figure(
            f"{iterations} iterations with the defaults: iterations completed",
            len(managed.record.prompt),
            "",
            1,
            Target(iterations + 1, at_most=False),
            note=managed.stop_reason.value,
        )
    )
    for label in ("defaults, cache", "compaction only, cache"):
        prompts = by_label[label].record.prompt
        half = len(prompts) // 2
        section.add(
            Figure(
                f"{label}: largest request ÷ context window",
                max(prompts, default=0) / WINDOW,
                "×",
                1,
                Target(0.85),
                note=f"mean request, 2nd ÷ 1st half: {_mean(prompts[half:]) / _mean(prompts[:half]):.2f}×",
            )
        )
    for label in ("defaults", "compaction only"):
        cached, uncached = by_label[f"{label}, cache"], by_label[f"{label}, no cache"]
        section.add(
            Figure(
                f"{label}: full-price input tokens, with ÷ without the prompt cache",
                sum(cached.record.full_price) / max(sum(uncached.record.full_price), 1),
                "×",
                1,
                note=f"{sum(cached.record.full_price):,} vs {sum(uncached.record.full_price):,} tokens",
            )
        )
    marks = sorted({m for m in (1, 2, 10, 25, 50, 100, 150, 200) if m <= iterations} | {iterations + 1})
    header = "| run | stop reason | iterations | compactions | " + " | ".join(f"it. {m}" for m in marks)
    header += " | max | summary tokens |\n| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in marks)
    header += " | ---: | ---: |"
    rows = []
    for o in outcomes:
        r = o.record
        for kind, values in (("input", r.prompt), ("full price", r.full_price)):
            rows.append(
                f"| {o.config.label}: {kind} | {o.stop_reason.value} | {len(r.prompt)} | {r.compactions} | "
                + " | ".join(_at(values, m) for m in marks)
                + f" | {max(values, default=0):,} | {r.summary_tokens:,} |"
            )
    section.details.append(
        "**Input tokens per iteration** (input-side: uncached + cache reads + cache writes; full price: "
        "uncached + cache writes), at chosen iterations of each run:\n\n" + header + "\n" + "\n".join(rows)
    )
    off = by_label["management off"]
    section.notes.append(
        f"Without context management the run ends {off.stop_reason.value} after {len(off.record.prompt)} "
        f"iterations ({off.message[:120]}). Summary requests are not iterations; their tokens are in the "
        "last column and in the run's usage and budgets."
    )
