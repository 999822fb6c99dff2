"""Writing run progress into status: phase changes at once, progress at most every few seconds.

The writer is an observer of loop events. It never steers the loop; if the object is gone or the
run is being stopped, it stops writing instead of failing the run.

Why progress is coalesced: the transcript store already writes once per iteration, and that is the
durable record a restart resumes from. Status progress (iterations, tokens, cost) is for people and
kstatus; writing it every iteration would double the API writes of a busy operator. So a finished
iteration is written when the last status write is at least `progress_interval` old, otherwise once
that much time has passed (a timer, so a long model request still shows the latest progress).
Phase changes and the end of the run always carry the latest progress with them.

Nothing else writes an AgentRun's status: every patch is built from the status model
(api/status_patches.py) and sent from here, retried under the one policy (kube/retrying.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentrun.api import status_patches
from agentrun.api.status import AgentRunStatus, PendingApproval, Phase, QuotaWait, TranscriptRef
from agentrun.api.status_patches import StatusPatch
from agentrun.api.stops import Outcome
from agentrun.api.times import now_rfc3339
from agentrun.api.traces import Progress
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIError, APIGoneError, APINotFoundError
from agentrun.kube.retrying import DEFAULT_RETRY_POLICY, KubeRetryPolicy, RetriesStopped, retried
from agentrun.loop.events import (
    ApprovalDecided,
    ApprovalRequested,
    Checkpoint,
    ContextCompacted,
    Event,
    RunFinished,
    RunStarted,
)

logger = logging.getLogger(__name__)


async def mark_observed(
    kube: KubeClient, namespace: str, name: str, status: AgentRunStatus, generation: int | None
) -> None:
    """A finished run's newer generation marked observed (status_patches.observed), best effort.

    Gone or conflicting: the next watch event of the run tries again, so a failure is only logged.
    """
    patch = status_patches.observed(status, generation)
    if patch is None:
        return
    try:
        await kube.patch_run_status(namespace, name, patch.body())
    except APIError as exc:
        logger.debug("could not mark %s/%s observed (the next event retries): %s", namespace, name, exc)


class StatusWriter:
    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        name: str,
        generation: int | None,
        status: AgentRunStatus,
        stopping: Callable[[], bool],
        newest_generation: Callable[[], int | None] = lambda: None,
        retry: KubeRetryPolicy = DEFAULT_RETRY_POLICY,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        transcript: Callable[[], TranscriptRef | None] = lambda: None,
        progress_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name
        self._generation = generation
        self._newest_generation = newest_generation  # of the spec the run's latest event showed
        self._conditions: list[Mapping[str, Any]] = [
            c.model_dump(by_alias=True, exclude_unset=True) for c in status.conditions
        ]
        self._start_time = status.start_time
        self._stopping = stopping
        # Calls waiting for approval, in request order; `since` survives an operator restart.
        self._pending: dict[str, PendingApproval] = {}
        self._since = {p.tool_use_id: p.since for p in status.pending_approvals}
        self._clear_pending = bool(status.pending_approvals)
        # status.queuePosition is removed by the next write that is not a queue position.
        self._clear_queue_position = status.queue_position is not None
        # status.quotaWait likewise, by the next write that is not a wait for quota.
        self._clear_quota_wait = status.quota_wait is not None
        self._progress: Progress | None = None  # latest, so a wait for approval shows what was spent
        # A run resumed while its status already says Running for this generation (its replica died or
        # handed it over, or the operator restarted) writes nothing to say so again: that write would
        # stand between hundreds of resuming runs and their next model requests on a busy API server.
        self._still_running = (
            status.phase == Phase.RUNNING
            and bool(self._start_time)
            and all(c.observed_generation == generation for c in status.conditions)
        )
        self._stored_counts = (status.iterations, status.tool_calls)
        self._retry = retry
        self._sleep = sleep
        # status.transcript rides along with the patches we make anyway: no write of its own.
        self._transcript = transcript
        self._interval = progress_interval
        self._clock = clock
        self._last_write: float | None = None
        self._unwritten: Progress | None = None  # a finished iteration not in status yet
        self._flush: asyncio.Task[None] | None = None  # the pending progress write
        self._flush_waiting = False  # ... still waiting for its interval (not on the wire yet)
        # One write at a time, in order: a deferred progress write must never land after the end.
        self._lock = asyncio.Lock()
        self._finished = False
        self.gone = False
        self.writes = 0

    async def notify(self, event: Event) -> None:
        """Each loop event to the write it calls for; events the status does not show are ignored."""
        match event:
            case RunStarted(progress=progress) if self._resumes_quietly():
                self._resumed(progress)
            case RunStarted(progress=progress):
                await self._started(progress)
            case Checkpoint(progress=progress, trace=trace):
                await self._checkpointed(progress, iteration_done=trace is not None)
            case RunFinished(outcome=outcome, progress=progress):
                await self._finish(outcome, progress)
            case ContextCompacted() as done:
                await self._compacted(done)
            case ApprovalRequested(tool_use_id=call_id, tool_name=tool, input=call_input):
                await self._approval_requested(call_id, tool, call_input)
            case ApprovalDecided(tool_use_id=call_id, tool_name=tool, approved=approved, by=by):
                await self._approval_decided(call_id, tool, approved=approved, by=by)
            case _:
                pass

    def _resumes_quietly(self) -> bool:
        """A resumed run whose status already says Running and has nothing to clear writes no start.

        Pending approvals or a queue position left in status must go, so such a run writes as a new one.
        """
        return self._still_running and not (
            self._clear_pending or self._clear_queue_position or self._clear_quota_wait
        )

    def _resumed(self, progress: Progress) -> None:
        """Progress the status missed (its interval) goes out in the background, like any progress."""
        if (progress.iterations, progress.tool_calls) != self._stored_counts:
            self._unwritten = progress
            self._schedule_progress(0.0)

    async def _started(self, progress: Progress) -> None:
        """Running, with the start time kept from an earlier start (a resumed run keeps its own)."""
        self._start_time = self._start_time or now_rfc3339()
        # Calls still undecided after a restart ask again (ApprovalRequested) right away.
        started = self._left_queue(
            status_patches.running(self._start_time, clear_pending_approvals=self._clear_pending)
        )
        await self.write(
            started.merged(status_patches.progressed(progress)),
            Phase.RUNNING,
            "Running",
            "the agent loop is running",
        )

    async def _checkpointed(self, progress: Progress, *, iteration_done: bool) -> None:
        """The latest progress kept; a finished iteration written now or once the interval is up.

        Written in the background: on a busy API server a status patch waits seconds for a connection,
        and the run's next model request must not wait with it. A checkpoint without a trace row
        (mid-iteration) is only remembered: the next write carries it.
        """
        self._progress = progress
        if not iteration_done:
            return
        self._unwritten = progress
        if self._interval <= 0:  # every iteration, in line: the writes are the point of the setting
            await self._write_progress()
        else:
            due = self._due()
            if self._flush is None or self._flush.done() or (due <= 0 and self._flush_waiting):
                self._schedule_progress(due)

    async def _finish(self, outcome: Outcome, progress: Progress) -> None:
        """The run's end: the last write, which every later write (a deferred progress one) skips.

        Not cancelled: a deferred progress write already on the wire finishes first (the lock), and
        one still waiting finds the run finished and writes nothing.
        """
        async with self._lock:
            self._finished = True
            # A spec change during the run (a cancel, a TTL) is one the end acted on: it says so, or
            # kstatus (Flux) reads the finished run as in progress until the next event marks it observed.
            generation = self._generation
            newest = self._newest_generation()
            if newest is not None and (generation is None or newest > generation):
                generation = newest
            patch = status_patches.finished(
                outcome,
                progress,
                now=now_rfc3339(),
                generation=generation,
                previous_conditions=self._conditions,
            )
            if self._pending or self._clear_pending:
                patch = patch.merged(StatusPatch(cleared=frozenset({"pending_approvals"})))
            await self._patch(self._left_queue(patch))

    async def _compacted(self, done: ContextCompacted) -> None:
        """Rare and worth seeing at once: written now, with the latest progress."""
        patch = status_patches.compacted(
            compactions=done.compactions,
            iteration=done.iteration,
            tokens_before=done.tokens_before,
            tokens_after=done.tokens_after,
            tokens_removed=done.tokens_removed,
        )
        if self._progress is not None:
            patch = status_patches.progressed(self._progress).merged(patch)
        await self.write(
            patch,
            Phase.RUNNING,
            "Running",
            f"context compacted after iteration {done.iteration}: about {done.tokens_before} "
            f"-> {done.tokens_after} input tokens",
        )

    async def _approval_requested(self, call_id: str, tool: str, call_input: Mapping[str, Any]) -> None:
        """The call joins status.pendingApprovals, dated when it first asked (a restart keeps that)."""
        self._clear_pending = True
        since = self._since.get(call_id) or now_rfc3339()
        self._pending[call_id] = status_patches.pending_approval(call_id, tool, call_input, since)
        await self.write_pending(f"{tool} ({call_id}) waits for approval")

    async def _approval_decided(self, call_id: str, tool: str, *, approved: bool, by: str | None) -> None:
        """The call leaves the pending list; the run is Running again once none is left waiting."""
        if self._pending.pop(call_id, None) is None:
            return
        verdict = ("approved" if approved else "denied") + (f" by {by}" if by else "")
        if self._pending:
            await self.write_pending(f"{tool} ({call_id}) {verdict}")
        else:
            await self.write(
                status_patches.approvals_settled(),
                Phase.RUNNING,
                "Running",
                f"{tool} ({call_id}) {verdict}",
            )

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
            status_patches.progressed(progress),
            Phase.RUNNING,
            "Running",
            f"iteration {progress.iterations} done",
        )

    def _schedule_progress(self, delay: float) -> None:
        """One progress write pending at a time; one due now replaces a timer still waiting."""
        if self._flush is not None and self._flush_waiting:
            self._flush.cancel()
        self._flush_waiting = True
        self._flush = asyncio.create_task(self._write_progress_after(max(delay, 0.0)))

    async def _write_progress_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._flush_waiting = False
        due = self._due()
        if due > 0:  # another write happened meanwhile: wait for the interval after that one
            self._schedule_progress(due)
            return
        writes = self.writes
        try:
            await self._write_progress()
        except Exception as exc:  # nobody awaits this task; the next write carries the progress
            logger.warning("could not write the run's progress to status (kept for the next write): %s", exc)
            return
        # Progress that arrived while the patch was on the wire goes out once the interval is up. Only
        # after a write that happened: one skipped (the run stopping, gone) would be skipped again at once.
        if self.writes != writes and self._unwritten is not None:
            self._schedule_progress(self._due())

    async def close(self) -> None:
        """The run is over (or stopped): a deferred progress write has nothing left to say."""
        flush, self._flush = self._flush, None
        if flush is not None and not flush.done():
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush

    async def write_pending(self, what: str) -> None:
        count = len(self._pending)
        patch = status_patches.awaiting_approval(list(self._pending.values()))
        if self._progress is not None:
            patch = status_patches.progressed(self._progress).merged(patch)
        await self.write(
            patch,
            Phase.AWAITING_APPROVAL,
            "AwaitingApproval",
            f"{what}; {count} call{'s' if count != 1 else ''} awaiting approval in spec.approvals "
            "(kubectl agentrun approve|deny)",
        )

    async def store_unavailable(self, message: str) -> None:
        """The transcript store cannot be reached: the run waits at its checkpoint, and says why.
        The next ordinary write (progress, the end) replaces this condition."""
        await self.write(StatusPatch(), Phase.RUNNING, "TranscriptStoreUnavailable", message)

    async def pending(self, reason: str, message: str) -> None:
        await self.write(self._left_queue(status_patches.pending()), Phase.PENDING, reason, message)

    async def quota_pending(self, reason: str, message: str, wait: QuotaWait) -> None:
        """Pending for quota (quotas/admission.py), with what holds the run in status.quotaWait."""
        self._clear_quota_wait = True
        patch = self._left_queue(StatusPatch(), quota=False).merged(status_patches.quota_waiting(wait))
        await self.write(patch, Phase.PENDING, reason, message)

    async def queued(self, position: int, message: str) -> None:
        """Pending for a run slot at ``position``; the queue phase decides how often (phases.queue)."""
        patch = self._left_queue(StatusPatch(), queue=False).merged(status_patches.queued(position))
        self._clear_queue_position = True
        await self.write(patch, Phase.PENDING, "Queued", message)

    def _left_queue(self, patch: StatusPatch, *, queue: bool = True, quota: bool = True) -> StatusPatch:
        """``patch`` clearing the place in the operator's queue and in a quota's line it still shows."""
        if queue and self._clear_queue_position:
            patch = patch.merged(status_patches.left_queue())
        if quota and self._clear_quota_wait:
            patch = patch.merged(status_patches.left_quota_line())
            self._clear_quota_wait = False
        return patch

    async def write(self, patch: StatusPatch, phase: Phase, reason: str, message: str) -> None:
        async with self._lock:
            if self._finished:
                return
            if self._unwritten is not None and phase is not Phase.PENDING:
                patch = status_patches.progressed(self._unwritten).merged(patch)
            conditioned = status_patches.conditioned(
                phase,
                reason=reason,
                message=message,
                now=now_rfc3339(),
                generation=self._generation,
                previous=self._conditions,
            )
            await self._patch(patch.merged(conditioned))

    async def write_fields(self, patch: StatusPatch) -> None:
        """A patch of fields no phase or condition depends on (status.children)."""
        await self._patch(patch)

    async def _patch(self, patch: StatusPatch) -> None:
        if self.gone:
            return
        unwritten = self._unwritten  # newer progress may arrive while the patch is on the wire
        reference = self._transcript()
        if reference is not None:
            patch = patch.merged(status_patches.transcript(reference))
        body = patch.body()
        try:
            await retried(
                lambda: self._kube.patch_run_status(self._namespace, self._name, body),
                self._retry,
                what=f"writing the status of {self._namespace}/{self._name}",
                stopping=self._stopping,
                sleep=self._sleep,
            )
        except (APINotFoundError, APIGoneError):
            self.gone = True  # deleted meanwhile: nothing left to write to, and nothing wrong
            return
        except RetriesStopped:
            return
        self.writes += 1
        self._last_write = self._clock()
        if "iterations" in patch.fields and self._unwritten is unwritten:
            self._unwritten = None
        if "conditions" in body:
            self._conditions = list(body["conditions"])
