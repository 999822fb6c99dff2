"""Writing run progress into status: phase changes at once, progress at most every few seconds.

The writer is an observer of loop events. It never steers the loop; if the object is gone or the
run is being stopped, it stops writing instead of failing the run.

Why progress is coalesced: the transcript store already writes once per iteration, and that is the
durable record a restart resumes from. Status progress (iterations, tokens, cost) is for people and
kstatus; writing it every iteration would double the API writes of a busy operator. So a finished
iteration is written when the last status write is at least `progress_interval` old, otherwise once
that much time has passed (a timer, so a long model request still shows the latest progress).
Phase changes and the end of the run always carry the latest progress with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrun.api.conditions import bounded_result, conditions_for
from agentrun.api.status import Phase
from agentrun.api.stops import Outcome
from agentrun.api.traces import Progress
from agentrun.controller.kubeapi import KubeAPI, is_gone, is_transient
from agentrun.loop.events import (
    ApprovalDecided,
    ApprovalRequested,
    Checkpoint,
    Event,
    RunFinished,
    RunStarted,
)

logger = logging.getLogger(__name__)
PENDING_INPUT_LIMIT = 4096


def pending_input(value: Mapping[str, Any]) -> dict[str, Any]:
    """A call's input for status.pendingApprovals, cut when large: status must stay small."""
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= PENDING_INPUT_LIMIT:
        return dict(value)
    return {"_truncated": True, "_preview": text[:PENDING_INPUT_LIMIT]}


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def usage_status(progress: Progress) -> dict[str, Any]:
    u = progress.usage
    return {
        "inputTokens": u.input_tokens,
        "outputTokens": u.output_tokens,
        "cacheCreationInputTokens": u.cache_creation_input_tokens,
        "cacheReadInputTokens": u.cache_read_input_tokens,
        "totalTokens": u.total,
        "costUSD": None if progress.cost_usd is None else f"{progress.cost_usd:.6f}",
        "unpricedModels": list(progress.unpriced_models),
    }


def progress_status(progress: Progress) -> dict[str, Any]:
    return {
        "iterations": progress.iterations,
        "toolCalls": progress.tool_calls,
        "usage": usage_status(progress),
    }


def terminal_status(
    outcome: Outcome,
    progress: Progress,
    *,
    now: str,
    generation: int | None,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The whole terminal status for an outcome; shared by the operator and `agentrun run`."""
    reason = outcome.stop_reason
    if reason.succeeded:
        phase = Phase.SUCCEEDED
    elif reason.value == "Cancelled":
        phase = Phase.CANCELLED
    else:
        phase = Phase.FAILED
    result, truncated = bounded_result(outcome.result)
    condition_reason = outcome.condition_reason or reason.value
    return {
        "phase": phase.value,
        "stopReason": reason.value,
        "rawStopReason": outcome.raw_stop_reason,
        "message": outcome.message,
        "result": result,
        "resultTruncated": truncated or None,
        "completionTime": now,
        "observedGeneration": generation,
        **progress_status(progress),
        "conditions": conditions_for(
            phase,
            reason=condition_reason,
            message=outcome.message,
            now=now,
            generation=generation,
            previous=previous_conditions,
        ),
    }


class StatusWriter:
    def __init__(
        self,
        kube: KubeAPI,
        *,
        namespace: str,
        name: str,
        generation: int | None,
        status: Mapping[str, Any],
        stopping: Callable[[], bool],
        retries: int = 5,
        transcript: Callable[[], Mapping[str, Any] | None] = lambda: None,
        progress_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name
        self._generation = generation
        self._conditions: list[Mapping[str, Any]] = list(status.get("conditions") or [])
        self._start_time = status.get("startTime")
        self._stopping = stopping
        # Calls waiting for approval, in request order; `since` survives an operator restart.
        self._pending: dict[str, dict[str, Any]] = {}
        previous = status.get("pendingApprovals") or []
        self._since = {p.get("toolUseId"): p.get("since") for p in previous if isinstance(p, Mapping)}
        self._clear_pending = bool(previous)
        self._progress: Progress | None = None  # latest, so a wait for approval shows what was spent
        self._retries = retries
        # status.transcript rides along with the patches we make anyway: no write of its own.
        self._transcript = transcript
        self._interval = progress_interval
        self._clock = clock
        self._last_write: float | None = None
        self._unwritten: Progress | None = None  # a finished iteration not in status yet
        self._flush: asyncio.Task[None] | None = None
        # One write at a time, in order: a deferred progress write must never land after the end.
        self._lock = asyncio.Lock()
        self._finished = False
        self.gone = False
        self.writes = 0

    async def notify(self, event: Event) -> None:
        match event:
            case RunStarted(progress=progress):
                now = now_rfc3339()
                self._start_time = self._start_time or now
                # Calls still undecided after a restart ask again (ApprovalRequested) right away.
                stale = {"pendingApprovals": None} if self._clear_pending else {}
                await self.write(
                    {
                        "phase": Phase.RUNNING.value,
                        "startTime": self._start_time,
                        **progress_status(progress),
                        **stale,
                    },
                    Phase.RUNNING,
                    "Running",
                    "the agent loop is running",
                )
            case Checkpoint(progress=progress) if event.trace is None:
                self._progress = progress
            case Checkpoint(trace=trace, progress=progress) if trace is not None:
                self._progress = progress
                self._unwritten = progress
                due = self._due()
                if due <= 0:
                    await self._write_progress()
                elif self._flush is None or self._flush.done():
                    self._flush = asyncio.create_task(self._write_progress_after(due))
            case RunFinished(outcome=outcome, progress=progress):
                # Not cancelled: a deferred progress write already on the wire finishes first (the
                # lock), and one still waiting finds the run finished and writes nothing.
                async with self._lock:
                    self._finished = True
                    body = terminal_status(
                        outcome,
                        progress,
                        now=now_rfc3339(),
                        generation=self._generation,
                        previous_conditions=self._conditions,
                    )
                    if self._pending or self._clear_pending:
                        body["pendingApprovals"] = None
                    await self._patch(body)
            case ApprovalRequested(tool_use_id=call_id, tool_name=tool, input=call_input):
                self._clear_pending = True
                self._pending[call_id] = {
                    "toolUseId": call_id,
                    "toolName": tool,
                    "input": pending_input(call_input),
                    "since": self._since.get(call_id) or now_rfc3339(),
                }
                await self.write_pending(f"{tool} ({call_id}) waits for approval")
            case ApprovalDecided(tool_use_id=call_id, tool_name=tool, approved=approved, by=by):
                if self._pending.pop(call_id, None) is None:
                    return
                verdict = ("approved" if approved else "denied") + (f" by {by}" if by else "")
                if self._pending:
                    await self.write_pending(f"{tool} ({call_id}) {verdict}")
                else:
                    await self.write(
                        {"phase": Phase.RUNNING.value, "pendingApprovals": None},
                        Phase.RUNNING,
                        "Running",
                        f"{tool} ({call_id}) {verdict}",
                    )
            case _:
                pass

    def _due(self) -> float:
        """Seconds until progress may be written again (0 or less: now)."""
        if self._last_write is None or self._interval <= 0:
            return 0.0
        return self._last_write + self._interval - self._clock()

    async def _write_progress(self) -> None:
        progress = self._unwritten
        if progress is None:
            return
        await self.write(
            progress_status(progress), Phase.RUNNING, "Running", f"iteration {progress.iterations} done"
        )

    async def _write_progress_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        due = self._due()
        if due > 0:  # another write happened meanwhile: wait for the interval after that one
            self._flush = asyncio.create_task(self._write_progress_after(due))
            return
        try:
            await self._write_progress()
        except Exception as exc:  # nobody awaits this task; the next write carries the progress
            logger.warning("could not write the run's progress to status (kept for the next write): %s", exc)

    async def close(self) -> None:
        """The run is over (or stopped): a deferred progress write has nothing left to say."""
        flush, self._flush = self._flush, None
        if flush is not None and not flush.done():
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush

    async def write_pending(self, what: str) -> None:
        count = len(self._pending)
        progress = progress_status(self._progress) if self._progress is not None else {}
        await self.write(
            {
                "phase": Phase.AWAITING_APPROVAL.value,
                "pendingApprovals": list(self._pending.values()),
                **progress,
            },
            Phase.AWAITING_APPROVAL,
            "AwaitingApproval",
            f"{what}; {count} call{'s' if count != 1 else ''} awaiting approval in spec.approvals "
            "(kubectl agentrun approve|deny)",
        )

    async def pending(self, reason: str, message: str) -> None:
        await self.write({"phase": Phase.PENDING.value}, Phase.PENDING, reason, message)

    async def write(self, fields: dict[str, Any], phase: Phase, reason: str, message: str) -> None:
        async with self._lock:
            if self._finished:
                return
            if self._unwritten is not None and phase is not Phase.PENDING:
                fields = {**progress_status(self._unwritten), **fields}
            conditions = conditions_for(
                phase,
                reason=reason,
                message=message,
                now=now_rfc3339(),
                generation=self._generation,
                previous=self._conditions,
            )
            await self._patch(
                {
                    **fields,
                    "message": message,
                    "observedGeneration": self._generation,
                    "conditions": conditions,
                }
            )

    async def _patch(self, status: dict[str, Any]) -> None:
        if self.gone or self._stopping():
            return
        reference = self._transcript()
        if reference is not None:
            status = {**status, "transcript": dict(reference)}
        for attempt in range(self._retries + 1):
            try:
                await self._kube.patch_run_status(self._namespace, self._name, status)
            except Exception as exc:
                if is_gone(exc):
                    self.gone = True
                    return
                if not is_transient(exc) or attempt == self._retries:
                    raise
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
                if self._stopping():
                    return
            else:
                self.writes += 1
                self._last_write = self._clock()
                if "iterations" in status:
                    self._unwritten = None
                if "conditions" in status:
                    self._conditions = list(status["conditions"])
                return
