"""Kubernetes Events on AgentRuns: what `kubectl describe agentrun` shows the on-call engineer.

An observer of loop events, like the status writer. Events are bounded three ways, because an
agent loop can retry or ask for approvals many times and Events are stored in etcd:

* messages are scrubbed of anything shaped like a credential and cut to MAX_MESSAGE_CHARS; they
  never carry tool input or output, only names, counts and our own wording;
* a repeat of the same event (same type, reason and key) bumps `count` on the existing Event
  instead of creating a new one, as client-go's event correlator does;
* a token bucket per run caps posts (BURST at once, one more every REFILL_SECONDS); a resume and
  the terminal event always go out, and the terminal one says how many were dropped.

A run's start is not an Event: its status already says it (startTime, the Running phase and
condition), and Events are kept for what needs a person's attention or marks an end.

Posting never fails a run: an API error is logged once and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrun.api import GROUP, VERSION
from agentrun.api.times import now_rfc3339
from agentrun.kube.calling import KubeClient
from agentrun.loop.events import (
    ApprovalDecided,
    ApprovalRequested,
    ContextCompacted,
    Event,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    RunStarted,
)

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 512
BURST = 10
REFILL_SECONDS = 6.0
POST_TIMEOUT_SECONDS = 5.0
#: Posts made beside their runs, held until done (asyncio keeps only weak references to tasks).
_POSTING: set[asyncio.Task[None]] = set()
COMPONENT = "agentrun-operator"
#: The most characters of reportingInstance the API server accepts (events.k8s.io validation).
REPORTING_INSTANCE_CHARS = 128

_CREDENTIALS = re.compile(
    r"(sk-ant-[A-Za-z0-9_\-]+|Bearer\s+[A-Za-z0-9._\-]+|"
    r"(?i:(?:api[-_]?key|token|password|secret|authorization)[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?)"
    r"[^\s\"',}]+)"
)


def bounded(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Scrub credential-shaped substrings, then cut: an Event is readable by far more people."""
    scrubbed = _CREDENTIALS.sub(lambda m: _redact(m.group(0)), message)
    scrubbed = " ".join(scrubbed.split())
    return scrubbed if len(scrubbed) <= limit else scrubbed[: limit - 1] + "…"


def _redact(found: str) -> str:
    for separator in ("=", ":"):
        if separator in found and not found.startswith(("sk-ant-", "Bearer")):
            return found.split(separator, 1)[0] + separator + "[redacted]"
    return "[redacted]"


class EventSink(Protocol):
    async def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class KubeEventSink:
    """core/v1 Events: what `kubectl describe` and `kubectl get events` show."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def create(self, namespace: str, body: dict[str, Any]) -> None:
        await self._kube.create_event(namespace, body)

    async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        await self._kube.patch_event(namespace, name, body)


@dataclass(frozen=True)
class InvolvedRun:
    namespace: str
    name: str
    uid: str

    def reference(self) -> dict[str, str]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "AgentRun",
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }


@dataclass
class _Posted:
    name: str
    count: int
    first: str
    message: str
    dirty: bool = False


@dataclass
class TokenBucket:
    capacity: int
    refill_seconds: float
    clock: Callable[[], float]
    tokens: float = field(init=False)
    updated: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.capacity)
        self.updated = self.clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) / self.refill_seconds)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def new_event(
    *, name: str, involved: dict[str, Any], kind: str, reason: str, message: str, instance: str
) -> dict[str, Any]:
    """A first Event (count 1) about ``involved``, in its namespace; later repeats patch its count.

    ``instance`` is the replica's name (Settings.replica_name, as in its Lease, Kopf's identity and its
    quota reservations), so `kubectl get events` tells which replica reported; in a pod it is the pod's
    name, which is also its host name.
    """
    stamp = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": involved["namespace"]},
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:REPORTING_INSTANCE_CHARS],
    }


class RunEvents:
    """Per-run event recorder; an observer of loop events."""

    def __init__(
        self,
        sink: EventSink,
        run: InvolvedRun,
        *,
        instance: str,
        clock: Callable[[], float] = time.monotonic,
        burst: int = BURST,
        refill_seconds: float = REFILL_SECONDS,
        post_timeout: float = POST_TIMEOUT_SECONDS,
    ) -> None:
        self._sink = sink
        self._post_timeout = post_timeout
        self._run = run
        self._bucket = TokenBucket(burst, refill_seconds, clock)
        self._posted: dict[tuple[str, str, str], _Posted] = {}
        self._suppressed = 0
        self._failed = False
        self._instance = instance
        self._beside_run: set[asyncio.Task[None]] = set()

    async def notify(self, event: Event) -> None:
        match event:
            case RunStarted(resumed=True, progress=progress):
                # A fresh start is no Event: status.startTime and the Running phase say it, and an
                # Event per run is 0.2 API writes per iteration of a 5-iteration run. A resume is
                # rare and worth a person's notice (a restart or a handoff happened).
                message = f"resumed from its checkpoint after {progress.iterations} iterations"
                # Posted beside the run, not before its next model request: resumes come in bursts (a
                # replica's runs taken over at once, an operator restart), when the API server is
                # busiest, and each post may take up to POST_TIMEOUT_SECONDS (bench: failover).
                self._beside(self.record("Normal", "Resumed", message, always=True))
            case ModelRetryScheduled(retry_class=retry_class, attempt=attempt, message=message):
                await self.record(
                    "Warning",
                    "ModelRetry",
                    f"model request failed ({retry_class}), retry {attempt} scheduled: {message}",
                    key=retry_class,
                )
            case ModelRequestFinished(outcome="error", model=model, iteration=iteration):
                await self.record(
                    "Warning",
                    "ModelError",
                    f"model request to {model} failed in iteration {iteration} and is not retried",
                    key=model,
                )
            case ContextCompacted() as done:
                # One Event for the run's compactions: each one bumps its count (client-go style).
                why = "the API refused the request as too long" if done.refused else "near the window"
                await self.record(
                    "Normal",
                    "ContextCompacted",
                    f"compaction {done.compactions} after iteration {done.iteration} ({why}): "
                    f"{done.turns} turns summarized, next request about {done.tokens_before} -> "
                    f"{done.tokens_after} input tokens; the transcript keeps every message",
                )
            case ApprovalRequested(tool_name=tool, tool_use_id=call_id):
                # A human has to act, so this one is never rate-limited; the input is not shown.
                await self.record(
                    "Normal",
                    "ApprovalRequested",
                    f"tool call {tool} ({call_id}) waits for approval in spec.approvals",
                    key=call_id,
                    always=True,
                )
            case ApprovalDecided() as decided:
                await self._approval_decided(decided)
            case RunFinished() as finished:
                await self._finished(finished)
            case _:
                pass

    async def _approval_decided(self, decided: ApprovalDecided) -> None:
        if decided.timed_out:
            kind, reason, what = "Warning", "ApprovalTimedOut", "was denied: no decision in time"
        else:
            kind, reason = "Normal", "ApprovalDecided"
            what = ("was approved" if decided.approved else "was denied") + (
                f" by {decided.by}" if decided.by else ""
            )
            if decided.reason:
                what += f": {decided.reason}"
        call_id = decided.tool_use_id
        await self.record(kind, reason, f"tool call {decided.tool_name} ({call_id}) {what}", key=call_id)

    async def _finished(self, finished: RunFinished) -> None:
        """The run's last Event, once every earlier one is posted: how it ended, what it used, and how
        many Events the rate limit held back."""
        outcome, progress = finished.outcome, finished.progress
        await self.settled()
        await self.flush()
        kind = "Normal" if outcome.stop_reason.succeeded else "Warning"
        cost = f", ${progress.cost_usd:.6f}" if progress.cost_usd is not None else ""
        summary = f"{outcome.message} ({progress.iterations} iterations, {progress.usage.total} tokens{cost})"
        if self._suppressed:
            summary += f"; {self._suppressed} earlier events were rate-limited"
        await self.record(kind, outcome.stop_reason.value, summary, always=True)

    async def record(
        self, kind: str, reason: str, message: str, *, key: str = "", always: bool = False
    ) -> None:
        """Post one event, or bump the count of the same event posted before."""
        text = bounded(message)
        posted = self._posted.get((kind, reason, key))
        if posted is not None:
            posted.count += 1
            posted.message = text
            posted.dirty = True
            if always or self._bucket.take():
                await self._bump(posted)
            return
        if not (always or self._bucket.take()):
            self._suppressed += 1
            return
        name = f"{self._run.name}.{time.time_ns():x}"
        body = new_event(
            name=name,
            involved=self._run.reference(),
            kind=kind,
            reason=reason,
            message=text,
            instance=self._instance,
        )
        if await self._call(self._sink.create(self._run.namespace, body)):
            self._posted[(kind, reason, key)] = _Posted(name, 1, body["firstTimestamp"], text)

    def _beside(self, post: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(post)
        # Held here and module-wide: the run's task may end (stopped, handed over) before the post does.
        for held in (self._beside_run, _POSTING):
            held.add(task)
            task.add_done_callback(held.discard)

    async def settled(self) -> None:
        """Waits for the posts made beside the run (so its terminal Event comes after them)."""
        if self._beside_run:
            await asyncio.gather(*self._beside_run, return_exceptions=True)

    async def flush(self) -> None:
        """Counts bumped while rate-limited are written before the run's last word."""
        for posted in self._posted.values():
            if posted.dirty:
                await self._bump(posted)

    async def _bump(self, posted: _Posted) -> None:
        body = {"count": posted.count, "message": posted.message, "lastTimestamp": now_rfc3339()}
        if await self._call(self._sink.patch(self._run.namespace, posted.name, body)):
            posted.dirty = False

    async def _call(self, request: Any) -> bool:
        try:
            await asyncio.wait_for(request, self._post_timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not self._failed:
                # A timeout's own text is empty: the line says what happened instead.
                why = (
                    f"no answer from the API server within {self._post_timeout:g} s"
                    if isinstance(exc, TimeoutError)
                    else str(exc) or type(exc).__name__
                )
                logger.warning("could not post a Kubernetes Event (further failures not logged): %s", why)
                self._failed = True
            return False
        return True
