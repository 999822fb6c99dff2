"""spec.approvals as the loop's Approvals: watch events feed decisions in, waiting calls wake up.

No polling: the Kopf event handler calls `update` with each new version of spec.approvals, parsed. The
run task seeds it from the object it started with, so decisions made while the operator was down
(or before a call was even requested) apply as soon as the call asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from agentrun.api.spec import Approval
from agentrun.loop.approving import Decision
from agentrun.loop.protocols import ToolCall


def decisions(entries: Iterable[Approval]) -> list[tuple[str, Decision]]:
    """Each entry of spec.approvals (the model admitted it: decision is approve or deny) as the loop's."""
    return [
        (entry.tool_use_id, Decision(approved=entry.decision == "approve", by=entry.by, reason=entry.reason))
        for entry in entries
    ]


class SpecApprovals:
    def __init__(self, entries: Iterable[Approval] = ()) -> None:
        self._decisions: dict[str, Decision] = {}
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self.update(entries)

    def update(self, entries: Iterable[Approval]) -> None:
        """The first decision for an id counts: a later entry cannot undo a call that already ran."""
        for tool_use_id, decision in decisions(entries):
            if tool_use_id in self._decisions:
                continue
            self._decisions[tool_use_id] = decision
            waiter = self._waiters.pop(tool_use_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(decision)

    def recorded(self, call: ToolCall) -> Decision | None:
        return self._decisions.get(call.id)

    async def decide(self, call: ToolCall) -> Decision:
        decision = self._decisions.get(call.id)
        if decision is not None:
            return decision
        waiter = self._waiters.get(call.id)
        if waiter is None or waiter.done():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters[call.id] = waiter
        # Shielded: the loop cancels this wait on timeout or cancel; the future stays reusable.
        return await asyncio.shield(waiter)
