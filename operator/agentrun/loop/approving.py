"""Human approval of tool calls: the loop asks, something outside the loop decides.

The loop knows only the Approvals protocol. The operator answers from `spec.approvals`; a local
`agentrun run` has nobody to ask and denies. A denial, like a timeout, becomes an is_error
tool_result the model reads and can adapt to: it is information for the agent, not a crash.
Calls of the same turn that need no approval run meanwhile; results keep the call order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentrun.loop.dispatching import Dispatcher, ToolOutcome
from agentrun.loop.errors import ToolError
from agentrun.loop.events import ApprovalDecided, ApprovalRequested
from agentrun.loop.protocols import Clock, Observer, ToolCall

TIMED_OUT = "approval timed out"


@dataclass(frozen=True)
class Decision:
    approved: bool
    by: str | None = None
    reason: str | None = None
    timed_out: bool = False


class Approvals(Protocol):
    def recorded(self, call: ToolCall) -> Decision | None:
        """A decision that already exists (made earlier, or before a restart): no need to wait."""
        ...

    async def decide(self, call: ToolCall) -> Decision:
        """Wait for a decision; the loop bounds the wait (approval timeout, run deadline, cancel)."""
        ...


class NoApprover:
    """For runs nobody watches (`agentrun run`): calls that need approval are denied at once."""

    REASON = "no approver is available for this run (approval needs the operator and spec.approvals)"

    def recorded(self, call: ToolCall) -> Decision | None:
        return Decision(approved=False, by="agentrun", reason=self.REASON)

    async def decide(self, call: ToolCall) -> Decision:
        return Decision(approved=False, by="agentrun", reason=self.REASON)


class ApprovalDenied(ToolError):
    """The tool_result of a denied call: who denied it and why, so the model can change course."""

    def __init__(self, call: ToolCall, decision: Decision) -> None:
        reason = decision.reason or "no reason given"
        who = f" by {decision.by}" if decision.by else ""
        super().__init__(
            "denied",
            f"the call to {call.name} was not approved{who}: {reason}",
            hint="the tool did not run; do not repeat the same call, adjust the plan or ask for "
            "something else",
            recoverable=True,
        )
        self.decision = decision

    def as_payload(self) -> dict[str, object]:
        return {**super().as_payload(), "reason": self.decision.reason, "by": self.decision.by}


async def wait_for_decision(approvals: Approvals, call: ToolCall, clock: Clock, timeout: float) -> Decision:
    """The approver's decision, or a denial once `timeout` seconds of the injected clock passed."""
    decision = asyncio.ensure_future(approvals.decide(call))
    timer = asyncio.ensure_future(clock.sleep(timeout))
    try:
        done, _ = await asyncio.wait({decision, timer}, return_when=asyncio.FIRST_COMPLETED)
        if decision in done:
            return decision.result()
        return Decision(approved=False, by=None, reason=TIMED_OUT, timed_out=True)
    finally:
        for task in (decision, timer):
            if not task.done():
                task.cancel()
        await asyncio.gather(decision, timer, return_exceptions=True)


@dataclass(frozen=True)
class ApprovalGate:
    approvals: Approvals
    clock: Clock
    observer: Observer
    timeout_seconds: float

    async def run(
        self,
        dispatcher: Dispatcher,
        calls: Sequence[ToolCall],
        rejected: Mapping[str, ToolError],
        gated: Collection[str],
    ) -> tuple[list[ToolOutcome], frozenset[str]]:
        """Run one turn's calls; ids in `gated` wait for a decision first. Returns the denied ids."""
        held = [(i, c) for i, c in enumerate(calls) if c.id in gated and c.id not in rejected]
        if not held:
            return await dispatcher.run(calls, rejected), frozenset()
        free = [(i, c) for i, c in enumerate(calls) if not (c.id in gated and c.id not in rejected)]
        known: dict[int, Decision] = {}
        for index, call in held:
            decision = self.approvals.recorded(call)
            if decision is not None:
                known[index] = decision
            else:
                # Announced before anything waits, so status lists every pending call of the turn.
                await self.observer.notify(
                    ApprovalRequested(call.iteration, call.id, call.name, dict(call.input))
                )
        denied: set[str] = set()

        async def one(index: int, call: ToolCall) -> list[ToolOutcome]:
            started = self.clock.monotonic()
            decision = known.get(index)
            if decision is None:
                decision = await wait_for_decision(self.approvals, call, self.clock, self.timeout_seconds)
            await self.observer.notify(
                ApprovalDecided(
                    call.iteration,
                    call.id,
                    call.name,
                    approved=decision.approved,
                    by=decision.by,
                    reason=decision.reason,
                    timed_out=decision.timed_out,
                    waited_seconds=self.clock.monotonic() - started,
                )
            )
            if decision.approved:
                return await dispatcher.run([call], {})
            denied.add(call.id)
            return await dispatcher.run([call], {call.id: ApprovalDenied(call, decision)})

        results = await asyncio.gather(
            dispatcher.run([c for _, c in free], rejected), *(one(i, c) for i, c in held)
        )
        by_index = dict(zip([i for i, _ in free], results[0], strict=True))
        for (index, _), outcomes in zip(held, results[1:], strict=True):
            by_index[index] = outcomes[0]
        return [by_index[i] for i in range(len(calls))], frozenset(denied)
