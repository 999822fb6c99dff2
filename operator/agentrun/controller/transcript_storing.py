"""The transcript store: a run's conversation and trace, persisted as append-only chunk objects.

Why chunks: status must stay small, a transcript can outgrow one object's 1 MiB limit, and rewriting
the whole history on every iteration would make each write cost more than the last. So every write
is a new object holding only what is new since the previous write, gzip-compressed.

Object layout (the reading API below and `kubectl agentrun transcript` rely on it):

* kind: Secret (default; type ``agentrun.dev/transcript``, tool output can be sensitive) or ConfigMap
  (``AGENTRUN_TRANSCRIPT_STORAGE=configmap``), in the run's namespace;
* name: ``<prefix>-<index>`` with ``prefix = <run name>-transcript`` (shortened with a hash for very
  long run names) and ``index`` counting from 0 without gaps;
* ``metadata.ownerReferences``: the AgentRun (its uid, ``controller: true``), so deleting the run
  garbage-collects its transcript;
* labels: ``agentrun.dev/run`` (the run name, hashed when longer than 63 characters),
  ``agentrun.dev/run-uid``, ``agentrun.dev/transcript-chunk`` (the index),
  ``app.kubernetes.io/managed-by: agentrun-operator``;
* annotation ``agentrun.dev/part: "i/n"``: one *record* (one write) normally fits one object; a
  record larger than `MAX_PART_BYTES` compressed is split over n consecutive objects;
* data: key ``chunk.json.gz`` (Secret ``data`` / ConfigMap ``binaryData``), base64 of the gzip
  bytes. Concatenating the parts of a record and gunzipping gives one JSON document:

  ``{"version": 1, "first": N, "messages": [...], "trace": [...], "progress": {...},
  "state": {...}, "toolsPending": bool, "outcome": {...} | null}``

  ``first`` is the index of the record's first message in the whole conversation; ``messages`` are
  raw Messages API content blocks per message; ``trace`` holds `TraceRow.as_dict` rows, one per
  iteration across the whole transcript; ``progress`` and ``state`` (`RunState.snapshot`) are
  cumulative as of the record's end; ``outcome`` is set in the last record of a finished run.

When the store writes (see README, "Durable runs"): a model answer that requests tools is written
before any tool runs, together with anything deferred; tool results are deferred to the next write
unless the tool phase took `flush_after_seconds` or longer; a checkpoint ending in a user message
(continuation, re-prompt, nudge) is written at once; the run's end is written with its outcome. In
steady state that is one transcript write per iteration, and its size depends on that iteration only.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, cast

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.api import GROUP, VERSION
from agentrun.controller.kubeapi import is_transient, unparsed
from agentrun.loop.events import Checkpoint, Event, Progress, RunFinished, TraceRow
from agentrun.loop.protocols import Message
from agentrun.loop.state import RunState
from agentrun.loop.stops import Outcome, StopReason
from agentrun.loop.usage import TokenUsage

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
DATA_KEY = "chunk.json.gz"
SECRET_TYPE = "agentrun.dev/transcript"
RUN_LABEL = "agentrun.dev/run"
UID_LABEL = "agentrun.dev/run-uid"
CHUNK_LABEL = "agentrun.dev/transcript-chunk"
PART_ANNOTATION = "agentrun.dev/part"
MANAGED_BY = {"app.kubernetes.io/managed-by": "agentrun-operator"}
# Compressed bytes per object: base64 makes it 4/3 larger in the request, and a Secret or ConfigMap
# holds at most 1 MiB of data; half of that leaves room for metadata and for etcd's request limit.
MAX_PART_BYTES = 512 * 1024
MAX_NAME = 253

StorageKind = Literal["secret", "configmap"]


class TranscriptError(Exception):
    """The transcript cannot be written or read; the run must not go on past its last checkpoint."""


class TranscriptConflict(TranscriptError):
    """A chunk with our name exists with different content: someone else writes this transcript."""


class TranscriptCorrupt(TranscriptError):
    """Stored records do not line up (a chunk was removed or edited by hand)."""


class StoreStopped(TranscriptError):
    """The run is being stopped (deleted, or the operator shuts down) while a write was due."""


# ------------------------------------------------------------------------------------------------
# Names and labels


def _short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def name_prefix(run_name: str) -> str:
    """``<run>-transcript``, shortened with a hash so ``<prefix>-<index>`` stays a valid name."""
    prefix = f"{run_name}-transcript"
    if len(prefix) <= MAX_NAME - 10:
        return prefix
    return f"{run_name[: MAX_NAME - 30].rstrip('.-')}-{_short_hash(run_name)}-transcript"


def run_label(run_name: str) -> str:
    """Label values are limited to 63 characters; longer run names keep a prefix and a hash."""
    if len(run_name) <= 63:
        return run_name
    return f"{run_name[:54].rstrip('.-')}-{_short_hash(run_name)}"


def object_kind(storage: StorageKind) -> str:
    return "Secret" if storage == "secret" else "ConfigMap"


# ------------------------------------------------------------------------------------------------
# Serialisation


def progress_to_dict(progress: Progress) -> dict[str, Any]:
    return {
        "iterations": progress.iterations,
        "toolCalls": progress.tool_calls,
        "usage": progress.usage.as_dict(),
        "costUSD": None if progress.cost_usd is None else str(progress.cost_usd),
        "unpricedModels": list(progress.unpriced_models),
    }


def progress_from_dict(raw: Mapping[str, Any]) -> Progress:
    cost = raw.get("costUSD")
    return Progress(
        iterations=int(raw.get("iterations", 0)),
        tool_calls=int(raw.get("toolCalls", 0)),
        usage=TokenUsage.from_dict(dict(raw.get("usage") or {})),
        cost_usd=None if cost is None else Decimal(cost),
        unpriced_models=tuple(raw.get("unpricedModels") or ()),
    )


def outcome_to_dict(outcome: Outcome) -> dict[str, Any]:
    return {
        "stopReason": outcome.stop_reason.value,
        "message": outcome.message,
        "result": outcome.result,
        "conditionReason": outcome.condition_reason,
        "rawStopReason": outcome.raw_stop_reason,
    }


def outcome_from_dict(raw: Mapping[str, Any]) -> Outcome:
    return Outcome(
        StopReason(raw["stopReason"]),
        str(raw.get("message", "")),
        result=raw.get("result"),
        condition_reason=raw.get("conditionReason"),
        raw_stop_reason=raw.get("rawStopReason"),
    )


def compress(record: Mapping[str, Any]) -> bytes:
    """Deterministic bytes (mtime 0): a retried write of the same record is byte-identical."""
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str)
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)


def split(data: bytes, max_part_bytes: int = MAX_PART_BYTES) -> list[bytes]:
    return [data[i : i + max_part_bytes] for i in range(0, len(data), max_part_bytes)] or [b""]


# ------------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class Transcript:
    """A stored transcript, decoded. Empty (no records) when nothing was written yet."""

    messages: list[Message] = field(default_factory=list)
    trace_rows: list[TraceRow] = field(default_factory=list)
    progress: Progress | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    tools_pending: bool = False
    outcome: Outcome | None = None
    records: int = 0
    chunks: int = 0
    bytes: int = 0
    next_index: int = 0  # the index the next chunk object gets (after every stored one)

    @property
    def empty(self) -> bool:
        return self.records == 0

    def run_state(self) -> RunState:
        """The loop state at the last persisted checkpoint, for `run_loop(state=...)`."""
        return RunState.restore(self.messages, self.state)


def _chunk_index(obj: Mapping[str, Any]) -> int:
    meta = obj.get("metadata") or {}
    return int((meta.get("labels") or {}).get(CHUNK_LABEL, "-1"))


def _part(obj: Mapping[str, Any]) -> tuple[int, int]:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(PART_ANNOTATION, "0/1")
    i, _, n = str(raw).partition("/")
    return int(i), int(n or 1)


def _payload(obj: Mapping[str, Any]) -> bytes:
    data = obj.get("data") if obj.get("kind", "Secret") == "Secret" else obj.get("binaryData")
    if not data and obj.get("binaryData"):
        data = obj.get("binaryData")
    return base64.b64decode((data or {}).get(DATA_KEY, ""))


def decode_objects(objects: Sequence[Mapping[str, Any]]) -> Transcript:
    """Rebuild a transcript from its chunk objects as JSON (what ``kubectl get -o json`` prints).

    Objects may come in any order. A record whose parts are not all present (the operator died
    while writing a split record) is skipped: it was never acknowledged to the loop.
    """
    ordered = sorted((o for o in objects if _chunk_index(o) >= 0), key=_chunk_index)
    messages: list[Message] = []
    rows: list[TraceRow] = []
    last: Mapping[str, Any] | None = None
    records = total_bytes = 0
    group: list[bytes] = []
    expected = 0
    for obj in ordered:
        part, parts = _part(obj)
        payload = _payload(obj)
        if part == 0:
            group, expected = [payload], parts
        elif group and part == len(group) and parts == expected:
            group.append(payload)
        else:
            group, expected = [], 0
            continue
        if len(group) < expected:
            continue
        joined = b"".join(group)
        group, expected = [], 0
        try:
            record = json.loads(gzip.decompress(joined))
        except (OSError, ValueError) as exc:
            raise TranscriptCorrupt(f"chunk {_chunk_index(obj)} does not decode: {exc}") from exc
        if int(record.get("first", len(messages))) != len(messages):
            raise TranscriptCorrupt(
                f"chunk {_chunk_index(obj)} starts at message {record.get('first')} but "
                f"{len(messages)} messages precede it"
            )
        messages.extend(record.get("messages") or [])
        rows.extend(TraceRow.from_dict(r) for r in record.get("trace") or [])
        records += 1
        total_bytes += len(joined)
        last = record
    if last is None:
        return Transcript(chunks=len(ordered), next_index=_next_index(ordered))
    return Transcript(
        messages=messages,
        trace_rows=rows,
        progress=progress_from_dict(last.get("progress") or {}),
        state=dict(last.get("state") or {}),
        tools_pending=bool(last.get("toolsPending")),
        outcome=outcome_from_dict(last["outcome"]) if last.get("outcome") else None,
        records=records,
        chunks=len(ordered),
        bytes=total_bytes,
        next_index=_next_index(ordered),
    )


def _next_index(ordered: Sequence[Mapping[str, Any]]) -> int:
    return _chunk_index(ordered[-1]) + 1 if ordered else 0


async def list_chunk_objects(
    core: client.CoreV1Api,
    namespace: str,
    *,
    run_name: str | None = None,
    uid: str | None = None,
    storage: StorageKind = "secret",
) -> list[dict[str, Any]]:
    """The raw chunk objects of one run, by run uid (exact) or by run name."""
    selectors = []
    if uid is not None:
        selectors.append(f"{UID_LABEL}={uid}")
    if run_name is not None:
        selectors.append(f"{RUN_LABEL}={run_label(run_name)}")
    lister = core.list_namespaced_secret if storage == "secret" else core.list_namespaced_config_map
    body = json.loads(
        await unparsed(lister(namespace, label_selector=",".join(selectors), _preload_content=False))
    )
    kind = object_kind(storage)
    return [{"kind": kind, **item} for item in body.get("items") or []]


async def load(
    core: client.CoreV1Api,
    namespace: str,
    run_name: str,
    *,
    uid: str | None = None,
    storage: StorageKind = "secret",
) -> Transcript:
    """Read one run's transcript (the public reading API; `uid` excludes an older run's leftovers)."""
    objects = await list_chunk_objects(core, namespace, run_name=run_name, uid=uid, storage=storage)
    return decode_objects(objects)


# ------------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class RunIdentity:
    namespace: str
    name: str
    uid: str


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status != 409 and is_transient(exc)
    return isinstance(exc, OSError | TimeoutError | asyncio.TimeoutError) or type(exc).__module__.startswith(
        "aiohttp"
    )


class TranscriptStore:
    """Observer of Checkpoint and RunFinished events; persists before the loop goes on.

    Must come before the status writer in the observer fan-out: status then references only
    chunks that exist, and a failed write stops the loop before anything else reacts.
    """

    def __init__(
        self,
        core: client.CoreV1Api,
        run: RunIdentity,
        *,
        storage: StorageKind = "secret",
        flush_after_seconds: float = 3.0,
        stopping: Callable[[], bool] = lambda: False,
        loaded: Transcript | None = None,
        max_part_bytes: int = MAX_PART_BYTES,
        retries: int = 8,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = core
        self._run = run
        self._storage: StorageKind = storage
        self._flush_after = flush_after_seconds
        self._stopping = stopping
        self._max_part = max_part_bytes
        self._retries = retries
        self._monotonic = monotonic
        self.prefix = name_prefix(run.name)
        self.writes = 0
        self._pending: list[Checkpoint] = []
        self._tools_since: float | None = None
        self._position(loaded or Transcript())

    def _position(self, transcript: Transcript) -> None:
        """Continue after `transcript`: new chunks follow its last object, records its last message."""
        self.next_index, self.chunks, self.bytes = transcript.next_index, transcript.chunks, transcript.bytes
        self._message_count = len(transcript.messages)
        self._last_progress = progress_to_dict(transcript.progress) if transcript.progress else {}
        self._last_state: dict[str, Any] = dict(transcript.state)

    @property
    def kind(self) -> str:
        return object_kind(self._storage)

    def reference(self) -> dict[str, Any] | None:
        """`status.transcript`: where the chunks are and how much they hold; None before any write."""
        if self.chunks == 0:
            return None
        return {"kind": self.kind, "namePrefix": self.prefix, "chunks": self.chunks, "bytes": self.bytes}

    async def load(self) -> Transcript:
        """This run's stored transcript (by uid); also positions the store after its last chunk."""
        transcript = await load(
            self._core, self._run.namespace, self._run.name, uid=self._run.uid, storage=self._storage
        )
        self._position(transcript)
        return transcript

    async def notify(self, event: Event) -> None:
        match event:
            case Checkpoint():
                if self._should_write_now(event):
                    await self._write(None)
                if event.tools_pending:
                    # The tool phase starts once this write is done: a slow API server is not a slow tool.
                    self._tools_since = self._monotonic()
            case RunFinished(outcome=outcome):
                await self._write(outcome)
            case _:
                pass

    def _should_write_now(self, checkpoint: Checkpoint) -> bool:
        self._pending.append(checkpoint)
        now = self._monotonic()
        if checkpoint.tools_pending:
            # Must be durable before any tool runs: a restart re-runs exactly these tool_use ids.
            return True
        if self._tools_since is not None:
            started, self._tools_since = self._tools_since, None
            # Cheap tools are re-run after a crash; slow ones (or a long approval wait) are kept.
            return now - started >= self._flush_after
        last = checkpoint.new_messages[-1] if checkpoint.new_messages else None
        if checkpoint.trace is None and checkpoint.iteration == 0:
            return False  # the task alone: nothing a restart could not rebuild from the spec
        # A follow-up user turn (continue, re-prompt, nudge) means another model call comes next:
        # write now so that call's predecessor and its usage are not lost. A bare assistant turn is
        # either the end (RunFinished follows at once) or pause_turn; both ride with the next write.
        return last is not None and last.get("role") == "user"

    def _record(self, outcome: Outcome | None) -> dict[str, Any] | None:
        pending, self._pending = self._pending, []
        if not pending and outcome is None:
            return None
        messages = [m for c in pending for m in c.new_messages]
        trace = [c.trace.as_dict() for c in pending if c.trace is not None]
        if pending:
            last = pending[-1]
            first = last.message_count - len(messages)
            progress, state, tools_pending = (
                progress_to_dict(last.progress),
                dict(last.state),
                last.tools_pending,
            )
        else:
            first, progress, state, tools_pending = (
                self._message_count,
                self._last_progress,
                self._last_state,
                False,
            )
        self._message_count = first + len(messages)
        self._last_progress, self._last_state = progress, state
        return {
            "version": FORMAT_VERSION,
            "first": first,
            "messages": messages,
            "trace": trace,
            "progress": progress,
            "state": state,
            "toolsPending": tools_pending,
            "outcome": outcome_to_dict(outcome) if outcome is not None else None,
        }

    async def _write(self, outcome: Outcome | None) -> None:
        record = self._record(outcome)
        if record is None:
            return
        data = compress(record)
        parts = split(data, self._max_part)
        for number, part in enumerate(parts):
            await self._create(self.next_index, number, len(parts), part)
            self.next_index += 1
            self.chunks += 1
        self.bytes += len(data)

    def _body(self, index: int, part: int, parts: int, payload: bytes) -> dict[str, Any]:
        run = self._run
        encoded = base64.b64encode(payload).decode()
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": self.kind,
            "metadata": {
                "name": f"{self.prefix}-{index}",
                "namespace": run.namespace,
                "labels": {
                    RUN_LABEL: run_label(run.name),
                    UID_LABEL: run.uid,
                    CHUNK_LABEL: str(index),
                    **MANAGED_BY,
                },
                "annotations": {PART_ANNOTATION: f"{part}/{parts}"},
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "AgentRun",
                        "name": run.name,
                        "uid": run.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
        }
        if self._storage == "secret":
            body["type"] = SECRET_TYPE
            body["data"] = {DATA_KEY: encoded}
        else:
            body["binaryData"] = {DATA_KEY: encoded}
        return body

    async def _create(self, index: int, part: int, parts: int, payload: bytes) -> None:
        body = self._body(index, part, parts, payload)
        name = body["metadata"]["name"]
        namespace = self._run.namespace
        for attempt in range(self._retries + 1):
            if self._stopping():
                raise StoreStopped(f"run {namespace}/{self._run.name} is stopping; chunk {name} not written")
            try:
                create = (
                    self._core.create_namespaced_secret
                    if self._storage == "secret"
                    else self._core.create_namespaced_config_map
                )
                await unparsed(create(namespace, cast(Any, body), _preload_content=False))
            except ApiException as exc:
                if exc.status == 409:
                    await self._check_existing(name, body)
                    self.writes += 1
                    return
                if not _transient(exc) or attempt == self._retries:
                    raise TranscriptError(
                        f"writing transcript chunk {namespace}/{name} failed: HTTP {exc.status} {exc.reason}"
                    ) from exc
            except Exception as exc:
                if not _transient(exc) or attempt == self._retries:
                    raise TranscriptError(
                        f"writing transcript chunk {namespace}/{name} failed: {exc!r}"
                    ) from exc
            else:
                self.writes += 1
                return
            delay = min(0.2 * 2**attempt, 5.0)
            logger.warning(
                "transcript chunk %s/%s not written yet (attempt %d); retrying", namespace, name, attempt + 1
            )
            await asyncio.sleep(delay)

    async def _check_existing(self, name: str, body: Mapping[str, Any]) -> None:
        """409 AlreadyExists: fine if it is our own earlier attempt (same bytes), else a conflict."""
        namespace = self._run.namespace
        reader = (
            self._core.read_namespaced_secret
            if self._storage == "secret"
            else self._core.read_namespaced_config_map
        )
        existing = {
            "kind": self.kind,
            **json.loads(await unparsed(reader(name, namespace, _preload_content=False))),
        }
        same_run = ((existing.get("metadata") or {}).get("labels") or {}).get(UID_LABEL) == self._run.uid
        ours = body.get("data") or body.get("binaryData") or {}
        theirs = existing.get("data") or existing.get("binaryData") or {}
        if same_run and ours.get(DATA_KEY) == theirs.get(DATA_KEY):
            return
        raise TranscriptConflict(
            f"transcript chunk {namespace}/{name} already exists with different content; "
            "is another operator instance running this AgentRun?"
        )
