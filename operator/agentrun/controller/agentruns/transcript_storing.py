"""The transcript store: persists a run's conversation and trace as append-only chunk objects.

The format (object layout, record encoding, decoding) is `agentrun.api.transcripts`; this module is
the I/O around it: reading a run's chunk objects by name and creating new ones, with retries and the
checks that keep two writers from interleaving.

When the store writes (see docs/durable-runs.md): a model answer that requests tools is written
before any tool runs, together with anything deferred; tool results are deferred to the next write
unless the tool phase took `flush_after_seconds` or longer; a checkpoint ending in a user message
(continuation, re-prompt, nudge) is written at once; the run's end is written with its outcome, and
what is deferred is written when the run yields to another replica. In
steady state that is one transcript write per iteration, and its size depends on that iteration only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agentrun.api.status import TranscriptRef
from agentrun.api.stops import Outcome
from agentrun.api.transcripts import (
    DATA_KEY,
    MAX_PART_BYTES,
    StorageKind,
    StoredChunk,
    Transcript,
    TranscriptCorrupt,
    TranscriptError,
    chunk_name,
    chunk_object,
    compress,
    decode_chunks,
    decode_objects,
    name_prefix,
    object_kind,
    progress_to_dict,
    record,
    run_uid_of,
    split,
)
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIConflictError, APIError, APINotFoundError
from agentrun.kube.retrying import DEFAULT_RETRY_POLICY, KubeRetryPolicy, RetriesStopped, retried
from agentrun.loop.events import Checkpoint, Event, RunFinished, RunYielded

logger = logging.getLogger(__name__)

# Chunk objects read at once when reading a transcript by name: the ones its status counts come in
# batches of at most READ_BATCH; those written after that status write are probed PROBE_BATCH at a time.
READ_BATCH = 32
PROBE_BATCH = 4


class TranscriptConflict(TranscriptError):
    """A chunk with our name exists with different content: someone else writes this transcript."""


class StoreStopped(TranscriptError):
    """The run is being stopped (deleted, or the operator shuts down) while a write was due."""


async def read_chunk_objects(
    kube: KubeClient,
    namespace: str,
    prefix: str,
    uid: str,
    *,
    known: int = 0,
    storage: StorageKind = "secret",
) -> list[dict[str, Any]]:
    """One run's chunk objects read by name: ``<prefix>-0`` on, until a name is not found.

    Why not a label-selected listing: the API server reads every Secret of the namespace to answer
    it, and counts it as that much work in its fairness queues, so a few hundred runs resuming at once
    (a replica's runs moving to the others) waited seconds for their listings in a namespace of 5000
    chunks. A GET by name costs the same whatever else the namespace holds, and the operator needs no
    right to list Secrets.

    ``known`` is how many chunks the run's status counted (`status.transcript.chunks`); later ones
    are probed for, since the status is written at most every status interval. A chunk it counts that
    is missing or another run's is a hole: resuming from before it would repeat what came after.
    """
    kind = object_kind(storage)

    async def get(index: int) -> dict[str, Any] | None:
        try:
            item = await kube.read_object(storage, namespace, chunk_name(prefix, index))
        except APINotFoundError:
            return None
        return {"kind": kind, **item}

    objects: list[dict[str, Any]] = []
    while True:
        start = len(objects)
        batch = min(known - start, READ_BATCH) if start < known else PROBE_BATCH
        found = await asyncio.gather(*(get(index) for index in range(start, start + batch)))
        for index, obj in enumerate(found, start):
            if obj is not None and run_uid_of(obj) == uid:
                objects.append(obj)
            elif index < known:
                what = "is missing" if obj is None else f"belongs to another run ({run_uid_of(obj)})"
                raise TranscriptCorrupt(
                    f"transcript chunk {namespace}/{chunk_name(prefix, index)} {what}, but the run's "
                    f"status counts {known} chunks"
                )
            else:
                return objects


# ------------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class RunIdentity:
    namespace: str
    name: str
    uid: str


class ChunkBackend(Protocol):
    """Where a run's chunks go when not in Secrets or ConfigMaps (the PostgreSQL store:
    postgres_chunks.py). Same duties as the object path below: a create is idempotent (our own earlier
    attempt is fine, different bytes are a `TranscriptConflict`) and a read raises `TranscriptCorrupt`
    on a hole among the `known` chunks the run's status counts."""

    @property
    def kind(self) -> str: ...

    async def create(self, chunk: StoredChunk) -> None: ...

    async def read(self, known: int) -> list[StoredChunk]: ...


class TranscriptStore:
    """Observer of Checkpoint and RunFinished events; persists before the loop goes on.

    Must come before the status writer in the observer fan-out: status then references only
    chunks that exist, and a failed write stops the loop before anything else reacts.
    """

    def __init__(
        self,
        kube: KubeClient,
        run: RunIdentity,
        *,
        storage: StorageKind = "secret",
        flush_after_seconds: float = 3.0,
        stopping: Callable[[], bool] = lambda: False,
        loaded: Transcript | None = None,
        max_part_bytes: int = MAX_PART_BYTES,
        retry: KubeRetryPolicy = DEFAULT_RETRY_POLICY,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        backend: ChunkBackend | None = None,
    ) -> None:
        self._kube = kube
        self._backend = backend
        self._run = run
        self._storage: StorageKind = storage
        self._flush_after = flush_after_seconds
        self._stopping = stopping
        self._max_part = max_part_bytes
        self._retry = retry
        self._monotonic = monotonic
        self._sleep = sleep
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
        return self._backend.kind if self._backend is not None else object_kind(self._storage)

    def reference(self) -> TranscriptRef | None:
        """`status.transcript`: where the chunks are and how much they hold; None before any write."""
        if self.chunks == 0:
            return None
        return TranscriptRef(kind=self.kind, name_prefix=self.prefix, chunks=self.chunks, bytes=self.bytes)

    async def load(self, *, counted: int = 0) -> Transcript:
        """This run's stored transcript; also positions the store after its last chunk.

        ``counted``: how many chunks the run's status names (0 when it names none yet).
        """
        run = self._run
        if self._backend is not None:
            transcript = decode_chunks(await self._backend.read(counted))
        else:
            objects = await read_chunk_objects(
                self._kube, run.namespace, self.prefix, run.uid, known=counted, storage=self._storage
            )
            transcript = decode_objects(objects)
        self._position(transcript)
        return transcript

    def counted(self, ref: TranscriptRef | None) -> int:
        """How many of this store's chunks a run's status names (`status.transcript`)."""
        if ref is None or ref.name_prefix != self.prefix or ref.kind != self.kind:
            return 0
        return max(ref.chunks, 0)

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
            case RunYielded():
                # Another replica resumes the run from what is written: deferred tool results too.
                await self._write(None)
            case _:
                pass

    def _should_write_now(self, checkpoint: Checkpoint) -> bool:
        self._pending.append(checkpoint)
        now = self._monotonic()
        if checkpoint.tools_pending or checkpoint.durable:
            # Must be durable before any tool runs: a restart re-runs exactly these tool_use ids.
            # A compaction too: its summary request must not be sent again after a restart.
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
        trace = [c.trace for c in pending if c.trace is not None]
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
        return record(
            first=first,
            messages=messages,
            trace=trace,
            progress=progress,
            state=state,
            tools_pending=tools_pending,
            outcome=outcome,
        )

    async def _write(self, outcome: Outcome | None) -> None:
        pending = self._record(outcome)
        if pending is None:
            return
        data = compress(pending)
        parts = split(data, self._max_part)
        for number, part in enumerate(parts):
            await self._create(self.next_index, number, len(parts), part)
            self.next_index += 1
            self.chunks += 1
        self.bytes += len(data)

    def _body(self, index: int, part: int, parts: int, payload: bytes) -> dict[str, Any]:
        return chunk_object(
            self._storage,
            namespace=self._run.namespace,
            run_name=self._run.name,
            run_uid=self._run.uid,
            index=index,
            part=part,
            parts=parts,
            payload=payload,
        )

    async def _create(self, index: int, part: int, parts: int, payload: bytes) -> None:
        if self._backend is not None:
            await self._backend.create(StoredChunk(index, part, parts, payload))
            self.writes += 1
            return
        body = self._body(index, part, parts, payload)
        name = body["metadata"]["name"]
        namespace = self._run.namespace

        async def create() -> bool:
            """False on 409: the name is taken, maybe by our own earlier attempt (checked below)."""
            try:
                await self._kube.create_object(self._storage, namespace, body)
            except APIConflictError:
                return False
            return True

        try:
            created = await retried(
                create,
                self._retry,
                what=f"writing transcript chunk {namespace}/{name}",
                stopping=self._stopping,
                sleep=self._sleep,
            )
            if not created:
                await self._check_existing(name, body)
        except RetriesStopped as exc:
            raise StoreStopped(
                f"run {namespace}/{self._run.name} is stopping; chunk {name} not written"
            ) from exc
        except APIError as exc:
            raise TranscriptError(f"writing transcript chunk {namespace}/{name} failed: {exc}") from exc
        self.writes += 1

    async def _check_existing(self, name: str, body: Mapping[str, Any]) -> None:
        """409 AlreadyExists: fine if it is our own earlier attempt (same bytes), else a conflict."""
        namespace = self._run.namespace
        existing = {"kind": self.kind, **await self._kube.read_object(self._storage, namespace, name)}
        same_run = run_uid_of(existing) == self._run.uid
        ours = body.get("data") or body.get("binaryData") or {}
        theirs = existing.get("data") or existing.get("binaryData") or {}
        if same_run and ours.get(DATA_KEY) == theirs.get(DATA_KEY):
            return
        raise TranscriptConflict(
            f"transcript chunk {namespace}/{name} already exists with different content; "
            "is another operator instance running this AgentRun?"
        )
