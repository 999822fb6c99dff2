"""The stored transcript format on its own: encode records into chunk objects, decode them back.

No API server here: this is what `kubectl agentrun transcript|trace` relies on to read what the
operator's store wrote, without importing the controller.
"""

from __future__ import annotations

import gzip
import json
import random
import string
import zlib
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pytest

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress, ToolTrace, TraceRow
from agentrun.api.transcripts import (
    CHUNK_LABEL,
    DATA_KEY,
    PART_ANNOTATION,
    RUN_LABEL,
    UID_LABEL,
    StorageKind,
    TranscriptCorrupt,
    chunk_object,
    chunk_selector,
    compress,
    decode_objects,
    name_prefix,
    progress_to_dict,
    record,
    run_label,
    split,
    storage_of,
)
from agentrun.api.usage import TokenUsage

RUN, UID = "demo", "uid-1"


def row(iteration: int) -> TraceRow:
    return TraceRow(
        iteration,
        "tool_use",
        (ToolTrace(f"toolu_{iteration}", "calc", "abc", 0.25, True),),
        TokenUsage(100, 10, 5, 7),
        "claude-haiku-4-5",
        request_id=f"req_{iteration}",
    )


def progress(iterations: int) -> Progress:
    return Progress(iterations, iterations, TokenUsage(100 * iterations, 10), Decimal("0.0125"), ("m-x",))


def write(
    records: Sequence[Mapping[str, Any]], storage: StorageKind = "secret", max_part_bytes: int = 512 * 1024
) -> list[dict[str, Any]]:
    """What the operator's store creates for these records, one chunk object per part."""
    objects, index = [], 0
    for each in records:
        parts = split(compress(each), max_part_bytes)
        for number, part in enumerate(parts):
            objects.append(
                chunk_object(
                    storage,
                    namespace="ns",
                    run_name=RUN,
                    run_uid=UID,
                    index=index,
                    part=number,
                    parts=len(parts),
                    payload=part,
                )
            )
            index += 1
    return objects


def first_records() -> list[dict[str, Any]]:
    task = {"role": "user", "content": [{"type": "text", "text": "the task"}]}
    asked = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}}],
    }
    answered = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}],
    }
    done = {"role": "assistant", "content": [{"type": "text", "text": "4"}]}
    state = {"iterations": 1}
    return [
        record(
            first=0,
            messages=[task, asked],
            trace=[],
            progress=progress_to_dict(progress(1)),
            state=state,
            tools_pending=True,
            outcome=None,
        ),
        record(
            first=2,
            messages=[answered, done],
            trace=[row(1), row(2)],
            progress=progress_to_dict(progress(2)),
            state={"iterations": 2},
            tools_pending=False,
            outcome=Outcome(StopReason.END_TURN, "finished", result="4", raw_stop_reason=None),
        ),
    ]


@pytest.mark.parametrize("storage", ["secret", "configmap"])
def test_records_written_as_chunk_objects_read_back_as_the_same_conversation_trace_and_outcome(
    storage: StorageKind,
) -> None:
    transcript = decode_objects(write(first_records(), storage))
    assert [m["role"] for m in transcript.messages] == ["user", "assistant", "user", "assistant"]
    assert transcript.trace_rows == [row(1), row(2)]
    assert transcript.progress == progress(2)
    assert transcript.state == {"iterations": 2}
    assert transcript.outcome == Outcome(StopReason.END_TURN, "finished", result="4")
    assert (transcript.records, transcript.chunks, transcript.next_index) == (2, 2, 2)
    assert not transcript.tools_pending and not transcript.empty


def test_a_chunk_object_is_owned_by_the_run_and_labelled_for_listing_by_uid_or_name() -> None:
    secret, config_map = write(first_records()[:1])[0], write(first_records()[:1], "configmap")[0]
    assert secret["kind"] == "Secret" and secret["type"] == "agentrun.dev/transcript"
    assert DATA_KEY in secret["data"] and DATA_KEY in config_map["binaryData"] and "data" not in config_map
    meta = secret["metadata"]
    assert meta["name"] == "demo-transcript-0"
    assert meta["labels"][RUN_LABEL] == RUN and meta["labels"][UID_LABEL] == UID
    assert meta["labels"][CHUNK_LABEL] == "0" and meta["annotations"][PART_ANNOTATION] == "0/1"
    (owner,) = meta["ownerReferences"]
    assert owner["uid"] == UID and owner["kind"] == "AgentRun" and owner["controller"] is True
    assert chunk_selector(run_name=RUN, uid=UID) == f"{UID_LABEL}={UID},{RUN_LABEL}={RUN}"
    assert storage_of("ConfigMap") == "configmap" and storage_of(None) == "secret"


def test_a_record_split_over_several_objects_reads_back_whole_and_a_missing_part_drops_only_it() -> None:
    noise = "".join(random.Random(7).choices(string.ascii_letters, k=20_000))
    records = first_records()
    records[1]["messages"][1]["content"][0]["text"] = noise
    objects = write(records, max_part_bytes=4096)
    assert len(objects) > 3
    whole = decode_objects(list(reversed(objects)))
    assert whole.messages[-1]["content"][0]["text"] == noise and whole.records == 2
    cut = decode_objects(objects[:-1])  # the operator died before the last part was written
    assert cut.records == 1 and len(cut.messages) == 2 and cut.outcome is None
    assert cut.next_index == len(objects) - 1


def test_a_record_that_does_not_follow_the_messages_before_it_is_reported_as_corrupt() -> None:
    records = first_records()
    records[1]["first"] = 5
    with pytest.raises(TranscriptCorrupt, match="starts at message 5 but 2 messages precede it"):
        decode_objects(write(records))


def test_names_and_labels_stay_within_kubernetes_limits() -> None:
    long_name = "a" * 200 + "." + "b" * 52
    assert len(long_name) == 253
    assert len(f"{name_prefix(long_name)}-9999999") <= 253
    assert name_prefix("demo") == "demo-transcript"
    label = run_label(long_name)
    assert len(label) <= 63 and label[0].isalnum() and label[-1].isalnum()
    assert run_label("demo") == "demo"
    assert run_label(long_name) != run_label(long_name[:-1] + "c")


@pytest.mark.parametrize("size", [0, 40, 511, 512, 3_000, 16_383, 16_384, 70_000, 400_000])
def test_a_record_of_any_size_compresses_to_the_same_bytes_each_time_and_any_gzip_reader_reads_it(
    size: int,
) -> None:
    rng = random.Random(size)
    text = "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(size))
    record = {"iteration": 1, "messages": [{"role": "user", "content": text}]}
    packed = compress(record)
    assert packed == compress(record)  # a retried write of the record is byte-identical
    for unpacked in (gzip.decompress(packed), zlib.decompress(packed, wbits=31)):
        assert json.loads(unpacked) == record
    # As small as the standard library's own gzip at the same level.
    assert len(packed) <= len(gzip.compress(json.dumps(record, separators=(",", ":")).encode(), 6)) + 2
