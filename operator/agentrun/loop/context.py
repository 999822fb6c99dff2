"""What every step of one run shares: its dependencies, its state, its deadline and cancel signal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from agentrun.api.stops import StopReason
from agentrun.api.traces import TraceRow
from agentrun.api.usage import TokenUsage
from agentrun.loop.approving import ApprovalGate
from agentrun.loop.config import LoopConfig
from agentrun.loop.dispatching import Dispatcher
from agentrun.loop.errors import ModelCallError
from agentrun.loop.events import Checkpoint, ContextCompacted
from agentrun.loop.protocols import (
    Allowance,
    Block,
    Clock,
    Message,
    ModelClient,
    ModelRequest,
    ModelResponse,
    Observer,
    Pricer,
    Tool,
    ToolCall,
)
from agentrun.loop.reserving import RequestSizer
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
class Meter:
    """One reserved attempt: the answer it got, if it got one (what the reservation settles to)."""

    response: ModelResponse | None = None


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
    allowance: Allowance | None = None
    sizes: RequestSizer = field(default_factory=RequestSizer)
    # Settlements under way: kept referenced so one shielded from a cancellation finishes.
    settling: set[asyncio.Future[None]] = field(default_factory=set)
    # Tasks inside guarded() (how deep), those the cancel signal interrupted, and the one task per run
    # that waits for the signal.
    _guarding: dict[asyncio.Task[Any], int] = field(default_factory=dict, init=False, repr=False)
    _interrupted: set[asyncio.Task[Any]] = field(default_factory=set, init=False, repr=False)
    _watcher: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

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
        """Await something that must stop on cancel or at the run's deadline, whichever first.

        Awaited in the calling task, under ``asyncio.timeout`` for the deadline; one task per run waits
        for the cancel signal and cancels whatever is guarded then (``close`` ends it). Why not a task
        per call raced against the signal with ``asyncio.wait``: that was two tasks, a wait and a gather
        for every model request and tool phase, about 30 µs each (docs/benchmarks.md).
        """
        if self.cancel.is_set():
            _discard(awaitable)
            raise Interrupted(StopReason.CANCELLED)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("guarded() runs inside a task")
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._interrupt_when_cancelled())
        self._guarding[task] = self._guarding.get(task, 0) + 1
        scope = asyncio.timeout(max(self.deadline - self.clock.monotonic(), 0))
        try:
            async with scope:
                return await awaitable
        except TimeoutError:
            if scope.expired():
                raise Interrupted(StopReason.TIMEOUT) from None
            raise
        except asyncio.CancelledError:
            # Interrupted only when the signal's cancellation is the one: not when the task is stopped
            if task in self._interrupted and task.uncancel() == 0:  # (operator shutdown) as well
                raise Interrupted(StopReason.CANCELLED) from None
            raise
        finally:
            depth = self._guarding.pop(task) - 1
            if depth:
                self._guarding[task] = depth
            else:
                self._interrupted.discard(task)

    async def _interrupt_when_cancelled(self) -> None:
        await self.cancel.wait()
        for task in self._guarding:
            if task not in self._interrupted:
                self._interrupted.add(task)
                task.cancel()

    async def close(self) -> None:
        """The run is over: the task waiting for its cancel signal ends."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    @contextlib.asynccontextmanager
    async def reserved(self, request: ModelRequest) -> AsyncIterator[Meter]:
        """One attempt of `request`, reserved against the quotas before it is sent and settled when
        its outcome is known (`Meter.response`: the answer, billed as reported). A request the API
        refused with an HTTP error status billed nothing; one that timed out, lost its connection,
        failed inside a 200 stream or was abandoned (cancel, deadline, shutdown) may have been
        served, so it is charged in full. Raises QuotaRefused (nothing sent) or Interrupted while
        waiting for room."""
        meter = Meter()
        allowance = self.allowance
        if allowance is None or not allowance.active():
            yield meter
            return
        spend = self.sizes.bound(request, self.state.compaction).spend(request.model, self.pricer)
        ticket = await self.guarded(allowance.reserve(spend))
        try:
            yield meter
        except ModelCallError as exc:
            refused = exc.status is not None and exc.status >= 400
            usage = TokenUsage() if refused else None
            cost = self.pricer.cost(request.model, usage) if usage is not None else None
            await self._settle(allowance, ticket, usage, cost)
            raise
        except BaseException:
            await self._settle(allowance, ticket, None, None)
            raise
        response = meter.response
        if response is None:
            await self._settle(allowance, ticket, None, None)
            return
        model = response.model or request.model
        await self._settle(allowance, ticket, response.usage, self.pricer.cost(model, response.usage))

    async def _settle(
        self, allowance: Allowance, ticket: object, usage: TokenUsage | None, cost: Decimal | None
    ) -> None:
        """Shielded: a cancellation of the run (shutdown, deletion) must not leave it reserved."""
        settling = asyncio.ensure_future(allowance.settle(ticket, usage, cost))
        self.settling.add(settling)
        settling.add_done_callback(self.settling.discard)
        await asyncio.shield(settling)

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
        if self.state.iterations >= self.config.limits.max_iterations and not self.state.final_turn:
            blocks = [*blocks, {"type": "text", "text": FINAL_TURN_PROMPT}]
        return {"role": "user", "content": blocks}


def _discard(awaitable: Awaitable[Any]) -> None:
    """Work never started: a coroutine closed (no 'never awaited' warning), a future cancelled."""
    if asyncio.iscoroutine(awaitable):
        awaitable.close()
    elif asyncio.isfuture(awaitable):
        awaitable.cancel()
