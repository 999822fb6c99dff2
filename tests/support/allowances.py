"""An in-memory quota for the loop's Allowance, and a loop run against the fake Messages API with it.

The allowance keeps every reservation with what it settled to, so a test can compare what the loop
reserved with what the fake server billed, request by request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import anthropic

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome
from agentrun.api.usage import TokenUsage
from agentrun.loop.clocks import SystemClock
from agentrun.loop.config import LoopConfig, RetryPolicy
from agentrun.loop.errors import QuotaRefused
from agentrun.loop.protocols import Allowance, Spend
from agentrun.loop.running import run_loop
from agentrun.loop.state import RunState
from agentrun.model.anthropic_calling import AnthropicModel
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.recording import Bill, RecordedRequest
from agentrun_sandbox.messages.script import Script, Step
from tests.support.loop_harness import FAST_RETRIES, Recorder
from tests.support.waiting import until

UNSETTLED = object()


@dataclass
class Reservation:
    """One reserve() call: what was asked, and what it settled to (UNSETTLED until then)."""

    spend: Spend
    usage: TokenUsage | object | None = UNSETTLED
    cost_usd: Decimal | object | None = UNSETTLED

    @property
    def settled(self) -> bool:
        return self.usage is not UNSETTLED

    @property
    def charged(self) -> int:
        """Tokens it counts for: the reservation while open or charged in full, else the usage."""
        if isinstance(self.usage, TokenUsage):
            return self.usage.total
        return self.spend.tokens


@dataclass
class MemoryAllowance:
    """A token quota in memory: a reservation that does not fit under `tokens` is refused.

    `refuse_from` refuses every reservation from that index on (0: the first), whatever it asks;
    `settle_delay` makes settling take time, so a test can see it finish after a cancellation.
    """

    tokens: int | None = None
    refuse_from: int | None = None
    settle_delay: float = 0.0
    quota_exists: bool = True  # False: no quota applies, as in a namespace without one
    reservations: list[Reservation] = field(default_factory=list)
    refused: list[Spend] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(r.charged for r in self.reservations)

    def active(self) -> bool:
        return self.quota_exists

    async def reserve(self, spend: Spend) -> object:
        index = len(self.reservations) + len(self.refused)
        over = self.tokens is not None and self.used + spend.tokens > self.tokens
        if over or (self.refuse_from is not None and index >= self.refuse_from):
            self.refused.append(spend)
            raise QuotaRefused(
                f"quota default/team: tokens {self.used} used + {spend.tokens} requested > {self.tokens}"
            )
        reservation = Reservation(spend)
        self.reservations.append(reservation)
        return reservation

    async def settle(self, ticket: object, usage: TokenUsage | None, cost_usd: Decimal | None) -> None:
        assert isinstance(ticket, Reservation) and not ticket.settled, ticket
        if self.settle_delay:
            await asyncio.sleep(self.settle_delay)
        ticket.usage = usage
        ticket.cost_usd = cost_usd


@dataclass
class QuotaRun:
    outcome: Outcome | None  # None: the task running the loop was cancelled
    recorder: Recorder
    requests: list[RecordedRequest]
    bills: dict[str, Bill]

    @property
    def messages_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/v1/messages"]


async def run_with_allowance(
    steps: Sequence[Step],
    allowance: Allowance | None,
    *,
    tools: Sequence[Any] = (),
    spec: Mapping[str, Any] | None = None,
    marker: str = "[scenario:quota]",
    retry: RetryPolicy = FAST_RETRIES,
    context_window: int | None = None,
    prompt_cache: bool = False,
    client_timeout: float = 30,
    cancel: asyncio.Event | None = None,
    state: RunState | None = None,
    cancel_task_after_requests: int | None = None,
    cancel_again_after: float | None = None,
    always_stream: bool = False,
) -> QuotaRun:
    """The loop through the real SDK and adapter; `cancel_task_after_requests` cancels the task
    running it once the fake server has received that many requests (a shutdown mid-request), and
    `cancel_again_after` cancels it once more that many seconds later (while it settles)."""
    parsed = AgentRunSpec.model_validate({"task": f"{marker} do the thing", **(spec or {})})
    api = FakeMessagesAPI(
        scripts=[Script(marker, steps, context_window=context_window)],
        demo_brain=False,
        prompt_cache=prompt_cache,
    )
    recorder = Recorder()
    async with api.running() as server:
        client = anthropic.AsyncAnthropic(
            api_key="sk-test", base_url=server.url, max_retries=0, timeout=client_timeout
        )
        try:
            task = asyncio.ensure_future(
                run_loop(
                    LoopConfig.from_spec(parsed, run_id="run-uid", retry=retry),
                    model=AnthropicModel(client, always_stream=always_stream),
                    tools={t.name: t for t in tools},
                    observer=recorder,
                    clock=SystemClock(),
                    pricer=PriceTable(),
                    cancel=cancel or asyncio.Event(),
                    state=state,
                    allowance=allowance,
                )
            )
            outcome: Outcome | None = None
            if cancel_task_after_requests is None:
                outcome = await task
            else:
                await until(
                    lambda: len(list(server.requests)) >= cancel_task_after_requests or task.done(),
                    f"{cancel_task_after_requests} requests or the end of the run",
                    every=0.005,
                )
                task.cancel()
                if cancel_again_after is not None:
                    await asyncio.sleep(cancel_again_after)
                    task.cancel()
                try:
                    outcome = await task
                except asyncio.CancelledError:
                    outcome = None
        finally:
            await client.close()
        return QuotaRun(outcome, recorder, list(server.requests), {b.request_id: b for b in server.bills})
