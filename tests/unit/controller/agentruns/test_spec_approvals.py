"""spec.approvals as the loop's Approvals: what a watch event delivers wakes the waiting call."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun.api.spec import Approval
from agentrun.controller.agentruns.spec_approvals import SpecApprovals
from agentrun.loop.approving import Decision
from agentrun.loop.protocols import ToolCall


def entries(*given: dict[str, Any]) -> list[Approval]:
    return [Approval.model_validate(entry) for entry in given]


def _call(tool_use_id: str) -> ToolCall:
    return ToolCall(
        id=tool_use_id, name="deploy", input={}, idempotency_key=f"uid:{tool_use_id}", iteration=1
    )


async def test_a_decision_arriving_in_a_later_watch_event_wakes_the_waiting_call() -> None:
    approvals = SpecApprovals([])
    waiting = asyncio.ensure_future(approvals.decide(_call("toolu_1")))
    await asyncio.sleep(0)
    assert not waiting.done()
    approvals.update(entries({"toolUseId": "toolu_2", "decision": "approve", "by": "a"}))
    await asyncio.sleep(0)
    assert not waiting.done()
    approvals.update(
        entries(
            {"toolUseId": "toolu_2", "decision": "approve", "by": "a"},
            {"toolUseId": "toolu_1", "decision": "deny", "by": "b", "reason": "no"},
        )
    )
    assert await asyncio.wait_for(waiting, 1) == Decision(approved=False, by="b", reason="no")


async def test_decisions_seeded_from_the_spec_are_recorded_and_the_first_one_per_id_counts() -> None:
    approvals = SpecApprovals(
        entries(
            {"toolUseId": "toolu_1", "decision": "approve", "by": "alice"},
            {"toolUseId": "toolu_1", "decision": "deny", "by": "mallory"},
        )
    )
    assert approvals.recorded(_call("toolu_1")) == Decision(approved=True, by="alice")
    assert approvals.recorded(_call("toolu_2")) is None
    assert await approvals.decide(_call("toolu_1")) == Decision(approved=True, by="alice")


async def test_a_wait_cancelled_by_the_loop_can_be_resumed_and_still_gets_the_decision() -> None:
    approvals = SpecApprovals()
    first = asyncio.ensure_future(approvals.decide(_call("toolu_1")))
    await asyncio.sleep(0)
    first.cancel()
    second = asyncio.ensure_future(approvals.decide(_call("toolu_1")))
    await asyncio.sleep(0)
    approvals.update(entries({"toolUseId": "toolu_1", "decision": "approve", "by": "a"}))
    assert (await asyncio.wait_for(second, 1)).approved
