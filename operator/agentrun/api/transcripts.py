"""The stored transcript format: how a run's conversation and trace are laid out in chunk objects.

Pure: no API client here. The operator's transcript store (controller/agentruns/transcript_storing.py) writes
this format and `kubectl agentrun transcript|trace` reads it; both import it from here, so the
plugin needs no part of the controller to decode a transcript.

Why chunks: status must stay small, a transcript can outgrow one object's 1 MiB limit, and rewriting
the whole history on every iteration would make each write cost more than the last. So every write
is a new object holding only what is new since the previous write, gzip-compressed.

The PostgreSQL store (agentrun/stores/postgres.py, ``AGENTRUN_TRANSCRIPT_STORAGE=postgres``) keeps the
same chunks as rows: index, part, parts and the gzip bytes (`StoredChunk`), decoded by `decode_chunks`
like the objects below.

Object layout:

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
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from agentrun import json_text
from agentrun.api import API_VERSION
from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress, TraceRow
from agentrun.api.usage import TokenUsage

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
# status.transcript.kind of a run whose chunks are rows of the PostgreSQL store (agentrun/stores/postgres.py).
POSTGRES_KIND = "postgres"


class TranscriptError(Exception):
    """The transcript cannot be written or read; the run must not go on past its last checkpoint."""


class TranscriptCorrupt(TranscriptError):
    """Stored records do not line up (a chunk was removed or edited by hand)."""


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


def chunk_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index}"


def run_label(run_name: str) -> str:
    """Label values are limited to 63 characters; longer run names keep a prefix and a hash."""
    if len(run_name) <= 63:
        return run_name
    return f"{run_name[:54].rstrip('.-')}-{_short_hash(run_name)}"


def object_kind(storage: StorageKind) -> str:
    return "Secret" if storage == "secret" else "ConfigMap"


def storage_of(kind: str | None) -> StorageKind:  # a "postgres" kind is read elsewhere (POSTGRES_KIND)
    """The storage a `status.transcript.kind` names; Secret unless it says ConfigMap."""
    return "configmap" if kind == "ConfigMap" else "secret"


def chunk_selector(*, run_name: str | None = None, uid: str | None = None) -> str:
    """The label selector of one run's chunk objects: by run uid (exact), by run name, or both."""
    selectors = []
    if uid is not None:
        selectors.append(f"{UID_LABEL}={uid}")
    if run_name is not None:
        selectors.append(f"{RUN_LABEL}={run_label(run_name)}")
    return ",".join(selectors)


# ------------------------------------------------------------------------------------------------
# Encoding


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
        "output": outcome.output,
    }


def outcome_from_dict(raw: Mapping[str, Any]) -> Outcome:
    return Outcome(
        StopReason(raw["stopReason"]),
        str(raw.get("message", "")),
        result=raw.get("result"),
        condition_reason=raw.get("conditionReason"),
        raw_stop_reason=raw.get("rawStopReason"),
        output=raw.get("output"),
    )


def record(
    *,
    first: int,
    messages: Sequence[Mapping[str, Any]],
    trace: Sequence[TraceRow],
    progress: Mapping[str, Any],
    state: Mapping[str, Any],
    tools_pending: bool,
    outcome: Outcome | None,
) -> dict[str, Any]:
    """One write's JSON document; `progress` is already a `progress_to_dict` mapping."""
    return {
        "version": FORMAT_VERSION,
        "first": first,
        "messages": list(messages),
        "trace": [row.as_dict() for row in trace],
        "progress": dict(progress),
        "state": dict(state),
        "toolsPending": tools_pending,
        "outcome": outcome_to_dict(outcome) if outcome is not None else None,
    }


def compress(record: Mapping[str, Any]) -> bytes:
    """Deterministic gzip bytes (mtime 0, parameters from the size): a retried write is byte-identical.

    The window and hash table fit the record: zlib's defaults (32 KiB window, memLevel 8) set up
    about 256 KiB of state per call, which cost a 2 KB chunk several times its compression, for the same
    output size. From 4 KiB up the hash table is the default, from 16 KiB the window; any gzip reader
    reads every size.
    """
    data = json_text.encode(record, default=str)
    window = min(15, max(9, len(data).bit_length()))
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + window, min(8, window - 5))
    return packer.compress(data) + packer.flush()


def split(data: bytes, max_part_bytes: int = MAX_PART_BYTES) -> list[bytes]:
    return [data[i : i + max_part_bytes] for i in range(0, len(data), max_part_bytes)] or [b""]


def chunk_object(
    storage: StorageKind,
    *,
    namespace: str,
    run_name: str,
    run_uid: str,
    index: int,
    part: int,
    parts: int,
    payload: bytes,
) -> dict[str, Any]:
    """The Secret or ConfigMap holding part `part` of `parts` of one record, at chunk `index`."""
    encoded = base64.b64encode(payload).decode()
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": object_kind(storage),
        "metadata": {
            "name": chunk_name(name_prefix(run_name), index),
            "namespace": namespace,
            "labels": {
                RUN_LABEL: run_label(run_name),
                UID_LABEL: run_uid,
                CHUNK_LABEL: str(index),
                **MANAGED_BY,
            },
            "annotations": {PART_ANNOTATION: f"{part}/{parts}"},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "AgentRun",
                    "name": run_name,
                    "uid": run_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }
    if storage == "secret":
        body["type"] = SECRET_TYPE
        body["data"] = {DATA_KEY: encoded}
    else:
        body["binaryData"] = {DATA_KEY: encoded}
    return body


# ------------------------------------------------------------------------------------------------
# Decoding


@dataclass(frozen=True)
class Transcript:
    """A stored transcript, decoded. Empty (no records) when nothing was written yet."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    trace_rows: list[TraceRow] = field(default_factory=list)
    progress: Progress | None = None
    state: Mapping[str, Any] = field(default_factory=dict)
    tools_pending: bool = False
    outcome: Outcome | None = None
    records: int = 0
    chunks: int = 0
    bytes: int = 0
    next_index: int = 0  # the index the next chunk object gets (after every stored one)
    #: The cumulative counters at each record, oldest first: usage and spend over the run's time.
    progress_by_record: tuple[Progress, ...] = ()

    @property
    def empty(self) -> bool:
        return self.records == 0


def run_uid_of(obj: Mapping[str, Any]) -> str | None:
    """The uid of the run that wrote this chunk object (its label)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    uid = labels.get(UID_LABEL)
    return uid if isinstance(uid, str) else None


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


@dataclass(frozen=True)
class StoredChunk:
    """What any store keeps of one chunk: a chunk object's labels and data, or a database row."""

    index: int
    part: int
    parts: int
    payload: bytes


def chunk_of(obj: Mapping[str, Any]) -> StoredChunk:
    part, parts = _part(obj)
    return StoredChunk(_chunk_index(obj), part, parts, _payload(obj))


def decode_objects(objects: Sequence[Mapping[str, Any]]) -> Transcript:
    """Rebuild a transcript from its chunk objects as JSON (what ``kubectl get -o json`` prints)."""
    return decode_chunks([chunk_of(o) for o in objects])


def decode_chunks(chunks: Sequence[StoredChunk]) -> Transcript:
    """Rebuild a transcript from its chunks, whichever store held them: the one decoder.

    Chunks may come in any order. A record whose parts are not all present (the operator died
    while writing a split record) is skipped: it was never acknowledged to the loop.
    """
    ordered = sorted((c for c in chunks if c.index >= 0), key=lambda c: c.index)
    messages: list[dict[str, Any]] = []
    rows: list[TraceRow] = []
    progress: list[Progress] = []
    last: Mapping[str, Any] | None = None
    records = total_bytes = 0
    group: list[bytes] = []
    expected = 0
    for chunk in ordered:
        part, parts, payload = chunk.part, chunk.parts, chunk.payload
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
            decoded = json.loads(gzip.decompress(joined))
        except (OSError, ValueError) as exc:
            raise TranscriptCorrupt(f"chunk {chunk.index} does not decode: {exc}") from exc
        if int(decoded.get("first", len(messages))) != len(messages):
            raise TranscriptCorrupt(
                f"chunk {chunk.index} starts at message {decoded.get('first')} but "
                f"{len(messages)} messages precede it"
            )
        messages.extend(decoded.get("messages") or [])
        rows.extend(TraceRow.from_dict(r) for r in decoded.get("trace") or [])
        records += 1
        total_bytes += len(joined)
        progress.append(progress_from_dict(decoded.get("progress") or {}))
        last = decoded
    next_index = ordered[-1].index + 1 if ordered else 0
    if last is None:
        return Transcript(chunks=len(ordered), next_index=next_index)
    return Transcript(
        messages=messages,
        trace_rows=rows,
        progress=progress[-1],
        state=dict(last.get("state") or {}),
        tools_pending=bool(last.get("toolsPending")),
        outcome=outcome_from_dict(last["outcome"]) if last.get("outcome") else None,
        records=records,
        chunks=len(ordered),
        bytes=total_bytes,
        next_index=next_index,
        progress_by_record=tuple(progress),
    )
