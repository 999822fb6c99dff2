"""Human approval in the loop, driven through the real SDK against the scripted fake Messages API.

Time is a manual clock: the approval timeout passes only when a test moves it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anthropic

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.approving import TIMED_OUT, Approvals, Decision
from agentrun.loop.config import LoopConfig
from agentrun.loop.events import ApprovalDecided, ApprovalRequested, Event, RunFinished, ToolCallFinished
from agentrun.loop.protocols import Tool, ToolCall, ToolDefinition, ToolOutput
from agentrun.loop.running import run_loop
from agentrun.model.anthropic_calling import AnthropicModel
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from agentrun_sandbox.messages.script import Reply, Script, Step, text_block, tool_use_block
from tests.support.loop_harness import FAST_RETRIES, FakeTool, Recorder
from tests.support.waiting import until

MARKER = "[scenario:approvals]"


@dataclass
class NeedsApproval:
    """A tool declared with requiresApproval, as the registry builds it from spec.tools."""

    inner: FakeTool

    @property
    def definition(self) -> ToolDefinition:
        return dataclasses.replace(self.inner.definition, requires_approval=True)

    async def call(self, call: ToolCall) -> ToolOutput:
        return await self.inner.call(call)


class ManualClock:
    """Time moves only in `advance`; sleepers wake when their deadline has passed."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, wake))
        await wake

    def random(self) -> float:
        return 0.5

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for deadline, wake in self._sleepers:
            if deadline <= self.now and not wake.done():
                wake.set_result(None)
        self._sleepers = [(d, w) for d, w in self._sleepers if not w.done()]


@dataclass
class DeskApprovals:
    """An approver a test drives: decisions recorded up front or given while the loop waits."""

    recorded_decisions: dict[str, Decision] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    _given: dict[str, asyncio.Future[Decision]] = field(default_factory=dict)

    def _future(self, tool_use_id: str) -> asyncio.Future[Decision]:
        return self._given.setdefault(tool_use_id, asyncio.get_running_loop().create_future())

    def recorded(self, call: ToolCall) -> Decision | None:
        return self.recorded_decisions.get(call.id)

    async def decide(self, call: ToolCall) -> Decision:
        self.asked.append(call.id)
        return await asyncio.shield(self._future(call.id))

    def give(self, tool_use_id: str, decision: Decision) -> None:
        self._future(tool_use_id).set_result(decision)


class Waiter:
    """An observer that lets a test wait for the loop to reach an event."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()

    async def notify(self, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            self.requested.set()


class Both:
    def __init__(self, *observers: Any) -> None:
        self._observers = observers

    async def notify(self, event: Event) -> None:
        for observer in self._observers:
            await observer.notify(event)


@dataclass
class Started:
    task: asyncio.Task[Outcome]
    recorder: Recorder
    waiter: Waiter
    server: FakeMessagesAPI

    @property
    def requests(self) -> list[RecordedRequest]:
        return list(self.server.requests)


@asynccontextmanager
async def started(
    steps: Sequence[Step],
    *,
    tools: Mapping[str, Tool],
    approvals: Approvals | None,
    clock: ManualClock | None = None,
    cancel: asyncio.Event | None = None,
    limits: Mapping[str, Any] | None = None,
) -> AsyncIterator[Started]:
    spec = AgentRunSpec.model_validate({"task": f"{MARKER} do it", "limits": dict(limits or {})})
    api = FakeMessagesAPI(scripts=[Script(MARKER, steps)], demo_brain=False)
    recorder, waiter = Recorder(), Waiter()
    async with api.running() as server:
        client = anthropic.AsyncAnthropic(api_key="sk-test", base_url=server.url, max_retries=0, timeout=30)
        task = asyncio.ensure_future(
            run_loop(
                LoopConfig.from_spec(spec, run_id="run-uid", retry=FAST_RETRIES, approval_timeout_seconds=60),
                model=AnthropicModel(client),
                tools=tools,
                observer=Both(recorder, waiter),
                clock=clock or ManualClock(),
                pricer=PriceTable(),
                cancel=cancel or asyncio.Event(),
                approvals=approvals,
            )
        )
        try:
            yield Started(task, recorder, waiter, server)
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()


def _calls_then_answer(*blocks: dict[str, Any]) -> list[Step]:
    return [Reply(list(blocks)), Reply([text_block("done")])]


async def _finish(run: Started) -> Outcome:
    return await asyncio.wait_for(run.task, 30)


async def test_approved_call_runs_after_the_decision_and_its_result_reaches_the_model() -> None:
    deploy = FakeTool("deploy", answer="deployed v2")
    desk = DeskApprovals()
    steps = _calls_then_answer(tool_use_block("deploy", {"q": "v2"}, id="toolu_D"))
    async with started(steps, tools={"deploy": NeedsApproval(deploy)}, approvals=desk) as run:
        await asyncio.wait_for(run.waiter.requested.wait(), 10)
        assert deploy.calls == []
        desk.give("toolu_D", Decision(approved=True, by="alice"))
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.END_TURN
    assert [c.idempotency_key for c in deploy.calls] == ["run-uid:toolu_D"]
    requested = run.recorder.of(ApprovalRequested)
    assert [(e.tool_use_id, e.tool_name, e.input) for e in requested] == [("toolu_D", "deploy", {"q": "v2"})]
    decided = run.recorder.of(ApprovalDecided)
    assert [(e.tool_use_id, e.approved, e.by, e.timed_out) for e in decided] == [
        ("toolu_D", True, "alice", False)
    ]
    result = run.requests[1].body["messages"][-1]["content"][0]
    result.pop("cache_control", None)  # the breakpoint of the newest message, not part of the answer
    assert result == {"type": "tool_result", "tool_use_id": "toolu_D", "content": "deployed v2"}


async def test_denied_call_never_runs_and_the_model_sees_the_reason_as_an_error_result() -> None:
    deploy = FakeTool("deploy")
    desk = DeskApprovals()
    steps = _calls_then_answer(tool_use_block("deploy", {"q": "prod"}, id="toolu_D"))
    async with started(steps, tools={"deploy": NeedsApproval(deploy)}, approvals=desk) as run:
        await asyncio.wait_for(run.waiter.requested.wait(), 10)
        desk.give("toolu_D", Decision(approved=False, by="bob", reason="not during the freeze"))
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.END_TURN
    assert deploy.calls == []
    result = run.requests[1].body["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_D" and result["is_error"] is True
    body = json.loads(result["content"])
    assert (body["code"], body["reason"], body["by"], body["recoverable"]) == (
        "denied",
        "not during the freeze",
        "bob",
        True,
    )
    assert "not during the freeze" in body["message"]
    finished = run.recorder.of(ToolCallFinished)
    assert [(e.trace.ok, e.trace.error_code) for e in finished] == [(False, "denied")]
    assert run.recorder.of(RunFinished)[-1].progress.tool_calls == 0


async def test_a_call_nobody_decides_is_denied_when_the_approval_timeout_passes() -> None:
    deploy = FakeTool("deploy")
    clock = ManualClock()
    steps = _calls_then_answer(tool_use_block("deploy", {}, id="toolu_D"))
    async with started(
        steps,
        tools={"deploy": NeedsApproval(deploy)},
        approvals=DeskApprovals(),
        clock=clock,
        limits={"approvalTimeoutSeconds": 30},
    ) as run:
        await asyncio.wait_for(run.waiter.requested.wait(), 10)
        clock.advance(29)
        await asyncio.sleep(0.05)
        assert not run.recorder.of(ApprovalDecided)
        clock.advance(1)
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.END_TURN
    assert deploy.calls == []
    decided = run.recorder.of(ApprovalDecided)
    assert [(e.approved, e.reason, e.timed_out, e.waited_seconds) for e in decided] == [
        (False, TIMED_OUT, True, 30)
    ]
    body = json.loads(run.requests[1].body["messages"][-1]["content"][0]["content"])
    assert (body["code"], body["reason"]) == ("denied", "approval timed out")


async def test_operator_default_approval_timeout_applies_when_the_spec_sets_none() -> None:
    spec = AgentRunSpec.model_validate({"task": "x"})
    assert LoopConfig.from_spec(spec, run_id="r", approval_timeout_seconds=45).approval_timeout_seconds == 45
    spec = AgentRunSpec.model_validate({"task": "x", "limits": {"approvalTimeoutSeconds": 7}})
    assert LoopConfig.from_spec(spec, run_id="r", approval_timeout_seconds=45).approval_timeout_seconds == 7


async def test_cancel_while_awaiting_approval_cancels_the_run_and_answers_the_call() -> None:
    deploy = FakeTool("deploy")
    cancel = asyncio.Event()
    steps = _calls_then_answer(tool_use_block("deploy", {}, id="toolu_D"))
    async with started(
        steps, tools={"deploy": NeedsApproval(deploy)}, approvals=DeskApprovals(), cancel=cancel
    ) as run:
        await asyncio.wait_for(run.waiter.requested.wait(), 10)
        cancel.set()
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.CANCELLED
    assert deploy.calls == [] and len(run.requests) == 1
    last = run.recorder.transcript()[-1]
    assert last["role"] == "user"
    assert [(b["tool_use_id"], b["is_error"]) for b in last["content"]] == [("toolu_D", True)]


async def test_run_timeout_still_applies_while_awaiting_approval() -> None:
    deploy = FakeTool("deploy")
    steps = _calls_then_answer(tool_use_block("deploy", {}, id="toolu_D"))
    async with started(
        steps,
        tools={"deploy": NeedsApproval(deploy)},
        approvals=DeskApprovals(),
        limits={"timeoutSeconds": 1, "approvalTimeoutSeconds": 3600},
    ) as run:
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.TIMEOUT
    assert deploy.calls == []


async def test_other_calls_of_the_turn_run_while_one_waits_and_results_keep_call_order() -> None:
    deploy, lookup = FakeTool("deploy", answer="D"), FakeTool("lookup", answer="L")
    desk = DeskApprovals()
    steps = _calls_then_answer(
        tool_use_block("deploy", {}, id="toolu_1"),
        tool_use_block("lookup", {}, id="toolu_2"),
        tool_use_block("deploy", {"q": "again"}, id="toolu_3"),
    )
    tools: dict[str, Tool] = {"deploy": NeedsApproval(deploy), "lookup": lookup}
    async with started(steps, tools=tools, approvals=desk) as run:
        await asyncio.wait_for(run.waiter.requested.wait(), 10)
        await until(lambda: lookup.calls, "the call that needs no approval", every=0.01)
        assert [c.id for c in lookup.calls] == ["toolu_2"] and deploy.calls == []
        assert [e.tool_use_id for e in run.recorder.of(ApprovalRequested)] == ["toolu_1", "toolu_3"]
        desk.give("toolu_3", Decision(approved=True, by="alice"))
        desk.give("toolu_1", Decision(approved=False, by="alice", reason="no"))
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.END_TURN
    assert [c.id for c in deploy.calls] == ["toolu_3"]
    results = run.requests[1].body["messages"][-1]["content"]
    assert [(r["tool_use_id"], r.get("is_error", False)) for r in results] == [
        ("toolu_1", True),
        ("toolu_2", False),
        ("toolu_3", False),
    ]
    assert run.recorder.of(RunFinished)[-1].progress.tool_calls == 2


async def test_a_decision_already_recorded_applies_without_asking_again() -> None:
    deploy = FakeTool("deploy", answer="ok")
    desk = DeskApprovals(recorded_decisions={"toolu_D": Decision(approved=True, by="alice")})
    steps = _calls_then_answer(tool_use_block("deploy", {}, id="toolu_D"))
    async with started(steps, tools={"deploy": NeedsApproval(deploy)}, approvals=desk) as run:
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.END_TURN
    assert desk.asked == [] and not run.recorder.of(ApprovalRequested)
    assert [e.approved for e in run.recorder.of(ApprovalDecided)] == [True]
    assert len(deploy.calls) == 1


async def test_without_an_approver_calls_needing_approval_are_denied_and_others_run() -> None:
    deploy, lookup = FakeTool("deploy"), FakeTool("lookup")
    steps = _calls_then_answer(
        tool_use_block("deploy", {}, id="toolu_1"), tool_use_block("lookup", {}, id="toolu_2")
    )
    async with started(
        steps, tools={"deploy": NeedsApproval(deploy), "lookup": lookup}, approvals=None
    ) as run:
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.END_TURN
    assert deploy.calls == [] and len(lookup.calls) == 1
    first = run.requests[1].body["messages"][-1]["content"][0]
    assert first["is_error"] is True and "no approver" in json.loads(first["content"])["reason"]


async def test_a_call_written_as_text_needs_the_same_approval() -> None:
    deploy = FakeTool("deploy")
    steps = [
        Reply([text_block('<tool_use>{"name": "deploy", "input": {"q": "prod"}}</tool_use>')]),
        Reply([text_block("done")]),
    ]
    async with started(steps, tools={"deploy": NeedsApproval(deploy)}, approvals=None) as run:
        outcome = await _finish(run)
    assert outcome.stop_reason is StopReason.END_TURN
    assert deploy.calls == []
    note = run.requests[1].body["messages"][-1]["content"][0]["text"]
    assert "not approved" in note and '"code": "denied"' in note
