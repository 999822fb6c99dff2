"""spec.approvals as the loop's Approvals: watch events feed decisions in, waiting calls wake up.

No polling: the Kopf event handler calls `update` with each new version of spec.approvals. The
run task seeds it from the object it started with, so decisions made while the operator was down
(or before a call was even requested) apply as soon as the call asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun.loop.approving import Decision
from agentrun.loop.protocols import ToolCall


def parse_approvals(entries: Iterable[Any]) -> list[tuple[str, Decision]]:
    """Entries the CRD schema admitted; anything else (an older schema, a hand edit) is skipped."""
    parsed: list[tuple[str, Decision]] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        tool_use_id, decision = entry.get("toolUseId"), entry.get("decision")
        if not isinstance(tool_use_id, str) or decision not in ("approve", "deny"):
            continue
        by, reason = entry.get("by"), entry.get("reason")
        parsed.append(
            (
                tool_use_id,
                Decision(
                    approved=decision == "approve",
                    by=by if isinstance(by, str) else None,
                    reason=reason if isinstance(reason, str) else None,
                ),
            )
        )
    return parsed


class SpecApprovals:
    def __init__(self, entries: Iterable[Any] = ()) -> None:
        self._decisions: dict[str, Decision] = {}
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self.update(entries)

    def update(self, entries: Iterable[Any]) -> None:
        """The first decision for an id counts: a later entry cannot undo a call that already ran."""
        for tool_use_id, decision in parse_approvals(entries):
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
