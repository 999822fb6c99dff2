"""What every step of one run shares: its dependencies, its state, its deadline and cancel signal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agentrun.api.stops import StopReason
from agentrun.api.traces import TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.loop.approving import ApprovalGate
from agentrun.loop.config import LoopConfig
from agentrun.loop.dispatching import Dispatcher
from agentrun.loop.events import Checkpoint, ContextCompacted
from agentrun.loop.protocols import Block, Clock, Message, ModelClient, Observer, Pricer, Tool, ToolCall
from agentrun.loop.state import RunState

T = TypeVar("T")

FINAL_TURN_PROMPT = (
    "The iteration limit of this run has been reached. Do not call any more tools. "
    "Reply now with your best final answer based on what you have so far."
)


class CancelSignal(Protocol):
    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


class Interrupted(Exception):
    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass
class Context:
    config: LoopConfig
    model: ModelClient
    tools: Mapping[str, Tool]
    observer: Observer
    clock: Clock
    pricer: Pricer
    cancel: CancelSignal
    state: RunState
    dispatcher: Dispatcher
    deadline: float
    gate: ApprovalGate

    def gated(self, calls: Sequence[ToolCall]) -> set[str]:
        """Ids of calls whose tool is declared with requiresApproval."""
        return {
            c.id for c in calls if c.name in self.tools and self.tools[c.name].definition.requires_approval
        }

    async def emit_checkpoint(
        self, trace: TraceRow | None, *, tools_pending: bool, durable: bool = False
    ) -> None:
        new = list(self.state.unpersisted())
        await self.observer.notify(
            Checkpoint(
                iteration=self.state.iterations,
                new_messages=new,
                message_count=len(self.state.messages),
                trace=trace,
                progress=self.state.progress(self.pricer),
                tools_pending=tools_pending,
                state=self.state.snapshot(),
                durable=durable,
            )
        )
        self.state.persisted = len(self.state.messages)

    async def guarded(self, awaitable: Awaitable[T]) -> T:
        """Await something that must stop on cancel or at the run's deadline, whichever first."""
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self.cancel.wait())
        try:
            remaining = self.deadline - self.clock.monotonic()
            done, _ = await asyncio.wait(
                {work, stop}, timeout=max(remaining, 0), return_when="FIRST_COMPLETED"
            )
            if work in done:
                return work.result()
            raise Interrupted(StopReason.CANCELLED if stop in done else StopReason.TIMEOUT)
        finally:
            for task in (work, stop):
                if not task.done():
                    task.cancel()
            await asyncio.gather(work, stop, return_exceptions=True)

    async def count_compaction(
        self, *, before: int, after: int, turns: int, usage: TokenUsage, refused: bool = False
    ) -> None:
        """One compaction, the loop's own or the API's: counted in state, then told to observers."""
        state = self.state
        state.compactions += 1
        state.context_tokens_removed += max(before - after, 0)
        await self.observer.notify(
            ContextCompacted(
                iteration=state.iterations,
                compactions=state.compactions,
                tokens_before=before,
                tokens_after=after,
                turns=turns,
                usage=usage,
                tokens_removed=state.context_tokens_removed,
                refused=refused,
            )
        )

    def user_message(self, blocks: list[Block]) -> Message:
        """Every user turn we write carries the final-turn notice once the iteration limit is hit."""
        if self.state.iterations >= self.config.max_iterations and not self.state.final_turn:
            blocks = [*blocks, {"type": "text", "text": FINAL_TURN_PROMPT}]
        return {"role": "user", "content": blocks}
