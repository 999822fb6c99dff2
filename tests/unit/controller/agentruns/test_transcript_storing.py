"""The transcript store against the Kubernetes API emulator, through the real kubernetes_asyncio client."""

from __future__ import annotations

import base64
import gzip
import json
import random
import string
import time
from decimal import Decimal
from typing import Any

import pytest

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress, ToolTrace, TraceRow
from agentrun.api.transcripts import (
    CHUNK_LABEL,
    PART_ANNOTATION,
    RUN_LABEL,
    UID_LABEL,
    TranscriptCorrupt,
    TranscriptError,
    decode_objects,
)
from agentrun.api.usage import TokenUsage
from agentrun.controller.agentruns.transcript_storing import (
    RunIdentity,
    StoreStopped,
    TranscriptConflict,
    TranscriptStore,
)
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIForbiddenError
from agentrun.kube.retrying import KubeRetryPolicy
from agentrun.loop.events import Checkpoint, RunFinished, RunYielded
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.transcripts import list_chunk_objects, load
from tests.support.waiting import until


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_run(cluster: KubeEmulator, name: str = "demo") -> RunIdentity:
    obj = cluster.emulator.create_object(
        "agentruns",
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"task": "t"},
        },
    )
    return RunIdentity("default", name, obj["metadata"]["uid"])


def progress(iterations: int, tool_calls: int = 0) -> Progress:
    return Progress(
        iterations, tool_calls, TokenUsage(100 * iterations, 10 * iterations, 5, 7), Decimal("0.01")
    )


def assistant(iteration: int, text: str = "") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "text", "text": text or f"step {iteration}"},
            {"type": "tool_use", "id": f"toolu_{iteration}", "name": "calc", "input": {"n": iteration}},
        ],
    }


def results(iteration: int, text: str = "") -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": f"toolu_{iteration}", "content": text or "ok"}],
    }


def row(iteration: int) -> TraceRow:
    return TraceRow(
        iteration,
        "tool_use",
        (ToolTrace(f"toolu_{iteration}", "calc", "abc", 0.01, True),),
        TokenUsage(100, 10, 5, 7),
        "claude-haiku-4-5",
    )


class Conversation:
    """Emits the checkpoints the loop emits for a tool-using run, iteration by iteration."""

    def __init__(self, store: TranscriptStore, clock: FakeClock) -> None:
        self.store = store
        self.clock = clock
        self.count = 1
        self.iteration = 0

    async def start(self) -> None:
        task = {"role": "user", "content": [{"type": "text", "text": "the task"}]}
        await self.store.notify(Checkpoint(0, [task], 1, None, progress(0), False, {}))

    async def model_asked_for_tools(self, text: str = "") -> None:
        self.iteration += 1
        self.count += 1
        state = {"iterations": self.iteration, "toolCalls": self.iteration - 1}
        checkpoint = Checkpoint(
            self.iteration,
            [assistant(self.iteration, text)],
            self.count,
            None,
            progress(self.iteration),
            True,
            state,
        )
        await self.store.notify(checkpoint)

    async def tools_answered(self, seconds: float = 0.1, text: str = "") -> None:
        self.clock.now += seconds
        self.count += 1
        state = {"iterations": self.iteration, "toolCalls": self.iteration}
        checkpoint = Checkpoint(
            self.iteration,
            [results(self.iteration, text)],
            self.count,
            row(self.iteration),
            progress(self.iteration, self.iteration),
            False,
            state,
        )
        await self.store.notify(checkpoint)

    async def finish(self) -> None:
        self.iteration += 1
        self.count += 1
        answer = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
        final_row = TraceRow(self.iteration, "end_turn", (), TokenUsage(1, 1), "claude-haiku-4-5")
        await self.store.notify(
            Checkpoint(self.iteration, [answer], self.count, final_row, progress(self.iteration), False, {})
        )
        await self.store.notify(
            RunFinished(Outcome(StopReason.END_TURN, "finished", result="done"), progress(self.iteration))
        )


def store_for(kube: KubeClient, run: RunIdentity, clock: FakeClock, **kwargs: Any) -> TranscriptStore:
    return TranscriptStore(kube, run, flush_after_seconds=3.0, monotonic=clock, **kwargs)


async def test_a_tool_request_is_stored_before_tools_run_and_quick_results_ride_with_the_next_write(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock)
    talk = Conversation(store, clock)
    await talk.start()
    assert store.writes == 0, "the task alone is rebuilt from the spec"
    await talk.model_asked_for_tools()
    assert store.writes == 1
    await talk.tools_answered(seconds=0.5)
    assert store.writes == 1, "quick tool results wait for the next write"
    await talk.model_asked_for_tools()
    assert store.writes == 2
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert [m["role"] for m in transcript.messages] == ["user", "assistant", "user", "assistant"]
    assert [r.iteration for r in transcript.trace_rows] == [1]
    assert transcript.tools_pending
    assert transcript.state == {"iterations": 2, "toolCalls": 1}


async def test_a_slow_tool_phase_is_stored_on_its_own(cluster: KubeEmulator, kube: KubeClient) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock)
    talk = Conversation(store, clock)
    await talk.start()
    await talk.model_asked_for_tools()
    await talk.tools_answered(seconds=3.0)
    assert store.writes == 2
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert transcript.messages[-1]["role"] == "user" and not transcript.tools_pending
    assert transcript.progress is not None and transcript.progress.tool_calls == 1


async def test_a_run_yielding_to_another_replica_stores_its_deferred_tool_results_and_no_outcome(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock)
    talk = Conversation(store, clock)
    await talk.start()
    await talk.model_asked_for_tools()
    await talk.tools_answered(seconds=0.1)
    assert store.writes == 1
    await store.notify(RunYielded(progress(1, 1)))
    assert store.writes == 2
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert [m["role"] for m in transcript.messages] == ["user", "assistant", "user"]
    assert not transcript.tools_pending and transcript.outcome is None
    await store.notify(RunYielded(progress(1, 1)))
    assert store.writes == 2, "nothing left to write"


async def test_the_run_end_is_stored_with_its_outcome(cluster: KubeEmulator, kube: KubeClient) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock)
    talk = Conversation(store, clock)
    await talk.start()
    await talk.model_asked_for_tools()
    await talk.tools_answered()
    await talk.finish()
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert transcript.outcome == Outcome(StopReason.END_TURN, "finished", result="done")
    assert [r.iteration for r in transcript.trace_rows] == [1, 2]
    assert len(transcript.messages) == 4
    reference = store.reference()
    assert reference is not None
    assert reference.model_dump(by_alias=True) == {
        "kind": "Secret",
        "namePrefix": "demo-transcript",
        "chunks": 2,
        "bytes": transcript.bytes,
    }


async def test_chunks_are_owned_secrets_labelled_with_the_run_and_hold_gzip_json(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    talk = Conversation(store_for(kube, run, clock), clock)
    await talk.start()
    await talk.model_asked_for_tools()
    secret = cluster.emulator.get_object("secrets", "default", "demo-transcript-0")
    assert secret is not None
    meta = secret["metadata"]
    assert meta["labels"][RUN_LABEL] == "demo" and meta["labels"][UID_LABEL] == run.uid
    assert meta["labels"][CHUNK_LABEL] == "0" and meta["annotations"][PART_ANNOTATION] == "0/1"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentRun",
            "name": "demo",
            "uid": run.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert secret["type"] == "agentrun.dev/transcript"
    record = json.loads(gzip.decompress(base64.b64decode(secret["data"]["chunk.json.gz"])))
    assert record["first"] == 0 and len(record["messages"]) == 2


async def test_config_map_storage_keeps_the_same_layout_in_binary_data(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock, storage="configmap")
    talk = Conversation(store, clock)
    await talk.start()
    await talk.model_asked_for_tools()
    assert cluster.emulator.list_objects("secrets", "default") == []
    config_map = cluster.emulator.get_object("configmaps", "default", "demo-transcript-0")
    assert config_map is not None and "chunk.json.gz" in config_map["binaryData"]
    transcript = await load(kube, "default", "demo", uid=run.uid, storage="configmap")
    assert len(transcript.messages) == 2
    reference = store.reference()
    assert reference is not None and reference.kind == "ConfigMap"


async def test_bytes_written_per_iteration_do_not_grow_with_the_history(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock)
    talk = Conversation(store, clock)
    await talk.start()
    sizes = []
    for _ in range(60):
        before = store.bytes
        await talk.model_asked_for_tools(text="thinking about the next step " * 20)
        await talk.tools_answered(text="a tool result of a fixed size " * 20)
        sizes.append(store.bytes - before)
    # Every write holds one iteration's messages (its size varies by a few bytes of counters).
    assert max(sizes[1:]) - min(sizes[1:]) < 64, sizes
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert len(transcript.messages) == 1 + 2 * 60 - 1  # the last tool results are still deferred
    assert store.chunks == 60


def incompressible(size: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size))


async def test_a_record_larger_than_one_object_is_split_and_read_back_whole(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock, max_part_bytes=4096)
    talk = Conversation(store, clock)
    await talk.start()
    big = incompressible(20_000, seed=1)
    await talk.model_asked_for_tools(text=big)
    assert store.chunks >= 4
    parts = [
        o["metadata"]["annotations"][PART_ANNOTATION]
        for o in await list_chunk_objects(kube, "default", uid=run.uid)
    ]
    assert sorted(parts) == sorted(f"{i}/{store.chunks}" for i in range(store.chunks))
    await talk.tools_answered(seconds=5)
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert transcript.messages[1]["content"][0]["text"] == big
    assert transcript.records == 2 and transcript.next_index == store.chunks


async def test_the_default_part_size_keeps_each_secret_under_the_1_mib_data_limit(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock)
    talk = Conversation(store, clock)
    await talk.start()
    big = incompressible(2_500_000, seed=2)  # about 1.9 MB gzipped: more than any one object holds
    await talk.model_asked_for_tools(text=big)
    objects = await list_chunk_objects(kube, "default", uid=run.uid)
    assert len(objects) >= 4
    for obj in objects:
        assert len(base64.b64decode(obj["data"]["chunk.json.gz"])) <= 1024 * 1024
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert transcript.messages[1]["content"][0]["text"] == big


async def test_a_split_record_cut_short_by_a_crash_is_skipped_and_never_overwritten(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    store = store_for(kube, run, clock, max_part_bytes=4096)
    talk = Conversation(store, clock)
    await talk.start()
    await talk.model_asked_for_tools()
    first_chunks = store.chunks
    await talk.tools_answered(seconds=0.1)
    await talk.model_asked_for_tools(text=incompressible(20_000, seed=3))
    # The operator died after writing only the first part of the second record.
    for obj in await list_chunk_objects(kube, "default", uid=run.uid):
        index = int(obj["metadata"]["labels"][CHUNK_LABEL])
        if index > first_chunks:
            cluster.emulator.delete_object("secrets", "default", obj["metadata"]["name"])
    transcript = await load(kube, "default", "demo", uid=run.uid)
    assert transcript.records == 1 and len(transcript.messages) == 2
    assert transcript.next_index == first_chunks + 1
    assert await store_for(kube, run, FakeClock()).load(counted=first_chunks) == transcript  # by name
    resumed = store_for(kube, run, FakeClock(), loaded=transcript)
    await resumed.notify(
        Checkpoint(1, [results(1)], 3, row(1), progress(1, 1), False, {"iterations": 1, "toolCalls": 1})
    )
    await resumed.notify(RunFinished(Outcome(StopReason.TIMEOUT, "late"), progress(1, 1)))
    again = await load(kube, "default", "demo", uid=run.uid)
    assert [m["role"] for m in again.messages] == ["user", "assistant", "user"]
    assert again.outcome is not None and again.outcome.stop_reason is StopReason.TIMEOUT


async def test_a_retried_create_of_the_same_chunk_is_accepted_and_different_content_is_a_conflict(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    checkpoint = Checkpoint(1, [assistant(1)], 2, None, progress(1), True, {"iterations": 1})
    first = store_for(kube, run, clock)
    await first.notify(checkpoint)
    # The same write again from index 0, as after a lost answer to the first create.
    twin = store_for(kube, run, clock)
    await twin.notify(checkpoint)
    assert twin.chunks == 1
    other = store_for(kube, run, clock)
    with pytest.raises(TranscriptConflict):
        await other.notify(Checkpoint(1, [assistant(1, "something else")], 2, None, progress(1), True, {}))


async def test_deleting_the_run_garbage_collects_its_transcript(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    talk = Conversation(store_for(kube, run, clock), clock)
    await talk.start()
    await talk.model_asked_for_tools()
    await talk.tools_answered(seconds=10)
    assert len(cluster.emulator.list_objects("secrets", "default")) == 2
    cluster.emulator.delete_object("agentruns", "default", "demo")

    async def collected() -> bool:
        return cluster.emulator.list_objects("secrets", "default") == []

    await until(collected, "transcript chunks garbage-collected")


async def test_another_run_with_the_same_name_reads_only_its_own_chunks(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    old, clock = make_run(cluster), FakeClock()
    talk = Conversation(store_for(kube, old, clock), clock)
    await talk.start()
    await talk.model_asked_for_tools()
    transcript = await load(kube, "default", "demo", uid="another-uid")
    assert transcript.empty and transcript.messages == []


async def test_chunks_listed_in_any_order_decode_to_the_same_transcript(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, clock = make_run(cluster), FakeClock()
    talk = Conversation(store_for(kube, run, clock), clock)
    await talk.start()
    for _ in range(4):
        await talk.model_asked_for_tools()
        await talk.tools_answered()
    objects = await list_chunk_objects(kube, "default", uid=run.uid)
    forward, backward = decode_objects(objects), decode_objects(list(reversed(objects)))
    assert forward == backward
    assert [r.iteration for r in forward.trace_rows] == [1, 2, 3]
    assert decode_objects([]).empty and decode_objects([]).next_index == 0


async def test_a_refused_chunk_listing_raises_instead_of_reading_as_an_empty_transcript(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    """An empty transcript would restart the run from its task, repeating every iteration."""
    run, clock = make_run(cluster), FakeClock()
    talk = Conversation(store_for(kube, run, clock), clock)
    await talk.start()
    await talk.model_asked_for_tools()
    cluster.emulator.faults.add(verb="list", resource="secrets", status=403, times=1)
    with pytest.raises(APIForbiddenError) as refused:
        await load(kube, "default", "demo", uid=run.uid)
    assert refused.value.status == 403
    assert (await load(kube, "default", "demo", uid=run.uid)).tools_pending


def chunk_reads(cluster: KubeEmulator, since: int) -> dict[str, int]:
    """The emulator's Secret requests since a position in its request log, counted by verb."""
    counted: dict[str, int] = {}
    for entry in cluster.emulator.request_log[since:]:
        if entry.resource == "secrets":
            counted[entry.verb] = counted.get(entry.verb, 0) + 1
    return counted


async def stored_turns(
    cluster: KubeEmulator, kube: KubeClient, turns: int, *, text_size: int = 0, **options: Any
) -> RunIdentity:
    """A run whose store wrote ``turns`` tool turns, each tool phase long enough to be written at once."""
    run, clock = make_run(cluster), FakeClock()
    talk = Conversation(store_for(kube, run, clock, **options), clock)
    await talk.start()
    for turn in range(turns):
        await talk.model_asked_for_tools(text=incompressible(text_size, seed=turn) if text_size else "")
        await talk.tools_answered(seconds=10)
    return run


async def test_a_resumed_transcript_is_read_by_name_past_the_chunks_its_status_counts(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    """A label-selected listing makes the API server read every Secret of the namespace."""
    run = await stored_turns(cluster, kube, 3, text_size=6_000, max_part_bytes=4096)
    listed = await load(kube, "default", "demo", uid=run.uid)
    assert listed.chunks > listed.records >= 6  # split records among them
    for counted in (0, 2, listed.chunks):  # the status lags the chunks written after it
        mark = len(cluster.emulator.request_log)
        resumed = store_for(kube, run, FakeClock())
        assert await resumed.load(counted=counted) == listed
        assert resumed.next_index == listed.next_index
        reads = chunk_reads(cluster, mark)
        assert "list" not in reads and reads["get"] >= listed.chunks + 1


async def test_a_chunk_the_status_counts_that_is_gone_is_a_corrupt_transcript_not_its_end(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run = await stored_turns(cluster, kube, 2)
    cluster.emulator.delete_object("secrets", "default", "demo-transcript-0")
    mark = len(cluster.emulator.request_log)
    with pytest.raises(
        TranscriptCorrupt, match="demo-transcript-0 is missing, but the run's status counts 2"
    ):
        await store_for(kube, run, FakeClock()).load(counted=2)
    assert "list" not in chunk_reads(cluster, mark)


async def test_an_older_runs_chunks_under_the_same_names_are_not_read_as_this_runs(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    await stored_turns(cluster, kube, 1)
    newer = RunIdentity("default", "demo", "another-uid")
    assert (await store_for(kube, newer, FakeClock()).load(counted=0)).empty
    with pytest.raises(TranscriptCorrupt, match="belongs to another run"):  # its status cannot count it
        await store_for(kube, newer, FakeClock()).load(counted=1)


async def test_a_refused_chunk_read_raises_instead_of_reading_as_an_empty_transcript(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run = await stored_turns(cluster, kube, 1)
    cluster.emulator.faults.add(verb="get", resource="secrets", status=403, times=1)
    with pytest.raises(APIForbiddenError):
        await store_for(kube, run, FakeClock()).load(counted=0)
    again = await store_for(kube, run, FakeClock()).load(counted=0)
    assert not again.empty and again == await load(kube, "default", "demo", uid=run.uid)


async def test_a_slow_chunk_write_does_not_count_as_a_slow_tool_phase(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    """Under API server load, quick tool results still ride with the next write."""
    run = make_run(cluster)
    store = TranscriptStore(kube, run, flush_after_seconds=0.3, monotonic=time.monotonic)
    talk = Conversation(store, FakeClock())
    await talk.start()
    cluster.emulator.faults.add(verb="create", resource="secrets", status=None, delay=0.5, times=1)
    await talk.model_asked_for_tools()
    assert store.writes == 1
    await talk.tools_answered()
    assert store.writes == 1, "the 0.5 s write before the tools is not tool time"


class FakeSleep:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def ask_for_tools(store: TranscriptStore) -> None:
    """The task, then a model answer asking for tools: the first write of a run."""
    talk = Conversation(store, FakeClock())
    await talk.start()
    await talk.model_asked_for_tools()


async def test_a_chunk_the_server_refuses_for_now_is_retried_by_the_policy_and_written_once(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, sleep = make_run(cluster), FakeSleep()
    store = store_for(
        kube, run, FakeClock(), retry=KubeRetryPolicy(attempts=3, first_seconds=1.0), sleep=sleep
    )
    cluster.emulator.faults.add(verb="create", resource="secrets", status=500, times=2)
    cluster.emulator.faults.add(verb="create", resource="secrets", status=429, retry_after=2, times=1)
    await ask_for_tools(store)
    assert sleep.waits == [1.0, 2.0, 2.0]
    assert store.writes == 1 and store.chunks == 1
    assert (await load(kube, "default", "demo", uid=run.uid)).tools_pending


async def test_a_chunk_refused_for_good_fails_the_write_at_once_with_the_servers_answer(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    run, sleep = make_run(cluster), FakeSleep()
    store = store_for(kube, run, FakeClock(), sleep=sleep)
    cluster.emulator.faults.add(verb="create", resource="secrets", status=403, message="quota", times=1)
    with pytest.raises(TranscriptError, match=r"demo-transcript-0 failed: HTTP 403 .*quota") as failed:
        await ask_for_tools(store)
    assert isinstance(failed.value.__cause__, APIForbiddenError)
    assert sleep.waits == [] and store.writes == 0


async def test_a_run_being_stopped_ends_a_retried_chunk_write_as_store_stopped(
    cluster: KubeEmulator, kube: KubeClient
) -> None:
    stopping = False

    class StopWhileWaiting(FakeSleep):
        async def __call__(self, seconds: float) -> None:
            nonlocal stopping
            await super().__call__(seconds)
            stopping = True

    run, sleep = make_run(cluster), StopWhileWaiting()
    store = store_for(kube, run, FakeClock(), sleep=sleep, stopping=lambda: stopping)
    cluster.emulator.faults.add(verb="create", resource="secrets", status=503, times=5)
    with pytest.raises(StoreStopped, match="is stopping; chunk demo-transcript-0 not written"):
        await ask_for_tools(store)
    assert sleep.waits == [0.2] and store.writes == 0
