"""Durable runs: the real operator killed with SIGKILL mid-run and started again, cancel, delete, TTL.

Kill moments are chosen from what the fake servers have seen (the Messages API recorded request N;
the webhook holds a call), never from sleeps. The webhook tool is a real aiohttp server that counts
each Idempotency-Key it receives. The operator talks to the API server through a recording proxy
(tests/support/recording_proxy.py), so what it wrote is counted the same way on the emulator and on a
real server, failed and no-op writes included.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentrun.api.transcripts import Transcript
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    Reply,
    Script,
    ScriptUsage,
    SlowResponse,
    text_block,
    tool_use_block,
)
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import cancel_run, request, until, wait_finished
from tests.support.operator_process import OperatorProcess
from tests.support.ports import free_port
from tests.support.recording_proxy import RecordingProxy, recording_proxy
from tests.support.transcript_stores import EACH_STORE, StoreUnderTest, secret_transcript

API_KEY = "sk-ant-durable-test-0123456789"
STEP_USAGE = [ScriptUsage(100, 10, 0, 0), ScriptUsage(200, 20, 50, 0), ScriptUsage(300, 30, 0, 60)]
FINAL_USAGE = ScriptUsage(400, 40, 0, 0)
HOLD_FOREVER = 120.0  # the model "answers" only after the operator was killed
WAIT = 60.0  # seconds for the operator to get somewhere: a loaded machine and a real server are slow


class Webhook:
    """A webhook tool with side effects: records every Idempotency-Key; can hold a call's first attempt."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.hold: set[str] = set()  # tool_use ids whose first call blocks until released
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        body = await request.json()
        self.keys.append(key)
        if key.rpartition(":")[2] in self.hold and self.keys.count(key) == 1:
            self.held.set()
            await self.release.wait()
        return web.json_response({"recorded": body, "key": key})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}/hook"

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


def durable_script(tag: str, slow_step: int | None = None) -> Script:
    """Three iterations with one webhook call each (ids toolu_w1..3), then an answer."""
    steps = []
    for index in range(3):
        faults = (SlowResponse(seconds=HOLD_FOREVER),) if slow_step == index else ()
        steps.append(
            Reply(
                [tool_use_block("record", {"step": index + 1}, id=f"toolu_w{index + 1}")],
                usage=STEP_USAGE[index],
                faults=faults,
            )
        )
    final_faults = (SlowResponse(seconds=HOLD_FOREVER),) if slow_step == 3 else ()
    steps.append(Reply([text_block("all three recorded")], usage=FINAL_USAGE, faults=final_faults))
    return Script(tag, steps)


SCRIPTS = [
    durable_script("[durable:first-call]", slow_step=0),
    durable_script("[durable:after-tools]", slow_step=1),
    durable_script("[durable:after-flushed-tools]", slow_step=2),
    durable_script("[durable:tool-call]"),
    durable_script("[durable:hold]", slow_step=1),
    durable_script("[durable:plain]"),
]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY)
    async with api.running() as server:
        yield server


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    hook = Webhook()
    await hook.start()
    try:
        yield hook
    finally:
        await hook.stop()


OperatorFactory = Callable[..., Awaitable[OperatorProcess]]


@pytest.fixture
async def proxy(cluster: TestCluster) -> AsyncIterator[RecordingProxy]:
    """Between the operator and the API server; outlives every operator the test starts."""
    async with recording_proxy(cluster) as recording:
        yield recording


@pytest.fixture
async def start_operator(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    proxy: RecordingProxy,
    transcript_store: StoreUnderTest,
    tmp_path: Path,
) -> AsyncIterator[OperatorFactory]:
    started: list[OperatorProcess] = []

    async def start(env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> OperatorProcess:
        process = OperatorProcess(
            kubeconfig=proxy.kubeconfig,
            log_path=tmp_path / f"operator-{len(started)}.log",
            env={
                "ANTHROPIC_API_KEY": API_KEY,
                "ANTHROPIC_BASE_URL": model.url,
                **transcript_store.env,
                **(env or {}),
            },
            args=cluster.operator_args(args),
        )
        await process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        await process.stop()


async def transcript_collected(cluster: TestCluster, uid: str) -> bool:
    return not (await secret_transcript(cluster, uid)).chunks


async def run_gone(cluster: TestCluster, name: str) -> bool:
    return await cluster.get_run(name) is None


def assert_consistent(transcript: Transcript) -> None:
    """Every tool_use answered by exactly one tool_result, and one trace row per iteration."""
    uses = [
        b["id"]
        for m in transcript.messages
        if m["role"] == "assistant"
        for b in m["content"]
        if b.get("type") == "tool_use"
    ]
    answers = Counter(
        b["tool_use_id"]
        for m in transcript.messages
        if m["role"] == "user"
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    )
    assert sorted(uses) == sorted(answers) and set(answers.values()) == {1}, (uses, answers)
    iterations = [row.iteration for row in transcript.trace_rows]
    assert iterations == sorted(set(iterations)), iterations


def webhook_manifest(cluster: TestCluster, name: str, tag: str, hook: Webhook) -> dict[str, Any]:
    return agentrun(
        name,
        f"{tag} record three steps",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        tools=[
            {
                "http": {
                    "name": "record",
                    "description": "Records a step (a side effect).",
                    "url": hook.url,
                    "inputSchema": {"type": "object", "properties": {"step": {"type": "integer"}}},
                }
            }
        ],
        limits={"maxIterations": 6},
    )


def steps_requested(model: FakeMessagesAPI, tag: str) -> Counter[int]:
    return Counter(r.step for r in model.requests_for(tag) if r.step is not None)


async def assert_succeeded_once_each(
    store: StoreUnderTest, hook: Webhook, name: str, *, repeated: str | None
) -> dict[str, Any]:
    """The run succeeded once, each step and tool call once (``repeated``: the call in flight at a kill,
    twice), its transcript whole in ``store``; the run as it finished."""
    obj = await wait_finished(store.cluster, name, timeout=90)
    status, uid = obj["status"], obj["metadata"]["uid"]
    assert (status["phase"], status["stopReason"], status["result"]) == (
        "Succeeded",
        "EndTurn",
        "all three recorded",
    )
    assert (status["iterations"], status["toolCalls"]) == (4, 3)
    # Usage includes what was spent before the restart, and nothing twice.
    usage = status["usage"]
    assert usage["inputTokens"] == 100 + 200 + 300 + 400
    assert usage["outputTokens"] == 10 + 20 + 30 + 40
    assert (usage["cacheCreationInputTokens"], usage["cacheReadInputTokens"]) == (50, 60)
    transcript = await store.transcript(uid)
    assert_consistent(transcript)
    assert [row.iteration for row in transcript.trace_rows] == [1, 2, 3, 4]
    assert [row.usage.input_tokens for row in transcript.trace_rows] == [100, 200, 300, 400]
    assert transcript.outcome is not None and transcript.outcome.result == "all three recorded"
    assert status["transcript"]["kind"] == store.status_kind
    assert status["transcript"]["chunks"] == transcript.chunks
    # Each Idempotency-Key is the run uid and the tool_use id; only the in-flight one arrives twice.
    keys = Counter(hook.keys)
    expected = {f"{uid}:toolu_w{i}": 1 for i in (1, 2, 3)}
    if repeated is not None:
        expected[f"{uid}:{repeated}"] = 2
    assert dict(keys) == expected
    return obj


@EACH_STORE
async def test_killed_before_the_first_answer_the_run_starts_over_and_succeeds(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    transcript_store: StoreUnderTest,
    start_operator: OperatorFactory,
) -> None:
    tag = "[durable:first-call]"
    operator = await start_operator()
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "first", tag, webhook))
    await until(lambda: steps_requested(model, tag)[0] == 1, "the first model request", timeout=WAIT)
    await operator.stop(kill=True)
    await start_operator()
    await assert_succeeded_once_each(transcript_store, webhook, "first", repeated=None)
    assert steps_requested(model, tag) == Counter({0: 2, 1: 1, 2: 1, 3: 1})


@EACH_STORE
async def test_killed_during_a_tool_call_the_call_runs_again_with_the_same_idempotency_key(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    transcript_store: StoreUnderTest,
    start_operator: OperatorFactory,
) -> None:
    tag = "[durable:tool-call]"
    webhook.hold.add("toolu_w2")
    operator = await start_operator()
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "in-tool", tag, webhook))
    await until(webhook.held.is_set, "the webhook to hold the second call", timeout=WAIT)
    await operator.stop(kill=True)
    await start_operator()
    await assert_succeeded_once_each(transcript_store, webhook, "in-tool", repeated="toolu_w2")
    # The model answer that asked for the call was stored before the call ran: it is not asked again.
    assert steps_requested(model, tag) == Counter({0: 1, 1: 1, 2: 1, 3: 1})


@EACH_STORE
async def test_killed_between_a_tool_result_and_its_checkpoint_the_in_flight_iteration_is_redone(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    transcript_store: StoreUnderTest,
    start_operator: OperatorFactory,
) -> None:
    tag = "[durable:after-tools]"
    # A cheap tool's result is never written on its own, however slow a loaded machine makes the call.
    defer_tool_results = {"AGENTRUN_TRANSCRIPT_FLUSH_SECONDS": "600"}
    operator = await start_operator(defer_tool_results)
    await request(
        cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "after-tools", tag, webhook)
    )
    # The first call's result travels with the next write, which waits for the second model answer.
    await until(lambda: steps_requested(model, tag)[1] == 1, "the second model request", timeout=WAIT)
    assert len(webhook.keys) == 1
    await operator.stop(kill=True)
    await start_operator(defer_tool_results)
    await assert_succeeded_once_each(transcript_store, webhook, "after-tools", repeated="toolu_w1")
    assert steps_requested(model, tag) == Counter({0: 1, 1: 2, 2: 1, 3: 1})


@EACH_STORE
async def test_killed_before_a_model_call_after_a_stored_tool_result_nothing_runs_twice(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    transcript_store: StoreUnderTest,
    start_operator: OperatorFactory,
) -> None:
    tag = "[durable:after-flushed-tools]"
    flush_always = {"AGENTRUN_TRANSCRIPT_FLUSH_SECONDS": "0"}
    operator = await start_operator(flush_always)
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "flushed", tag, webhook))
    await until(lambda: steps_requested(model, tag)[2] == 1, "the third model request", timeout=WAIT)
    await operator.stop(kill=True)
    await start_operator(flush_always)
    await assert_succeeded_once_each(transcript_store, webhook, "flushed", repeated=None)
    assert steps_requested(model, tag) == Counter({0: 1, 1: 1, 2: 2, 3: 1})


async def test_steady_state_costs_at_most_two_writes_per_iteration(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    proxy: RecordingProxy,
    start_operator: OperatorFactory,
) -> None:
    await start_operator()
    await request(
        cluster,
        "POST",
        cluster.runs_path,
        json=webhook_manifest(cluster, "cheap", "[durable:plain]", webhook),
    )
    await wait_finished(cluster, "cheap")
    writes = [
        r
        for r in proxy.calls
        if r.verb in ("create", "patch", "update")
        and (r.resource == "secrets" or (r.resource == "agentruns" and r.subresource == "status"))
    ]
    chunk_writes = [r for r in writes if r.resource == "secrets"]
    status_writes = [r for r in writes if r.resource == "agentruns"]
    # 4 iterations: one chunk per tool request plus the end; status: Running, 4 iterations, the end.
    assert len(chunk_writes) == 4
    assert len(status_writes) <= 4 + 2


async def test_cancel_stops_a_run_waiting_for_the_model_and_keeps_its_transcript(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, start_operator: OperatorFactory
) -> None:
    tag = "[durable:hold]"
    await start_operator()
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "stop-me", tag, webhook))
    await until(lambda: steps_requested(model, tag)[1] == 1, "the second model request", timeout=WAIT)
    await cancel_run(cluster, "stop-me")
    obj = await wait_finished(cluster, "stop-me", timeout=20)
    status = obj["status"]
    assert (status["phase"], status["stopReason"]) == ("Cancelled", "Cancelled")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Succeeded"]["status"] == "False"
    transcript = await secret_transcript(cluster, obj["metadata"]["uid"])
    assert_consistent(transcript)
    assert transcript.outcome is not None and transcript.outcome.stop_reason.value == "Cancelled"
    assert status["transcript"]["chunks"] == transcript.chunks >= 1
    assert steps_requested(model, tag)[1] == 1, "the in-flight request was abandoned, not retried"


async def test_cancel_reaches_runs_that_are_queued_or_waiting_for_a_secret(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, start_operator: OperatorFactory
) -> None:
    await start_operator(args=("--max-concurrent-runs", "1"))
    await request(
        cluster,
        "POST",
        cluster.runs_path,
        json=webhook_manifest(cluster, "busy", "[durable:first-call]", webhook),
    )
    await until(
        lambda: steps_requested(model, "[durable:first-call]")[0] == 1, "the busy run's request", timeout=WAIT
    )
    await request(
        cluster,
        "POST",
        cluster.runs_path,
        json=webhook_manifest(cluster, "queued", "[durable:plain]", webhook),
    )
    waiting = agentrun(
        "no-key",
        "[durable:plain] x",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5", "apiKeySecretRef": {"name": "missing"}},
    )
    await request(cluster, "POST", cluster.runs_path, json=waiting)

    async def phase_reason(name: str) -> tuple[str | None, str | None]:
        status = (await request(cluster, "GET", f"{cluster.runs_path}/{name}")).get("status", {})
        reasons = {c["type"]: c["reason"] for c in status.get("conditions", [])}
        return status.get("phase"), reasons.get("Succeeded")

    async def queued() -> bool:
        return await phase_reason("queued") == ("Pending", "Queued")

    async def secret_missing() -> bool:
        return await phase_reason("no-key") == ("Pending", "SecretNotFound")

    await until(queued, "the second run to be Queued", timeout=WAIT)
    await until(secret_missing, "the third run to wait for its Secret", timeout=WAIT)
    patch = {"json": {"spec": {"cancel": True}}, "headers": {"Content-Type": "application/merge-patch+json"}}
    for name in ("queued", "no-key"):
        await request(cluster, "PATCH", f"{cluster.runs_path}/{name}", **patch)
    for name, where in (("queued", "while queued"), ("no-key", "while pending")):
        status = (await wait_finished(cluster, name, timeout=20))["status"]
        assert (status["phase"], status["stopReason"]) == ("Cancelled", "Cancelled")
        assert where in status["message"]
    assert not steps_requested(model, "[durable:plain]"), "cancelled runs never called the model"


async def test_a_deleted_run_stops_and_nothing_writes_its_status_after_the_delete(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    webhook: Webhook,
    proxy: RecordingProxy,
    start_operator: OperatorFactory,
) -> None:
    tag = "[durable:hold]"
    await start_operator()
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, "doomed", tag, webhook))
    await until(lambda: steps_requested(model, tag)[1] == 1, "the second model request", timeout=WAIT)
    uid = (await request(cluster, "GET", f"{cluster.runs_path}/doomed"))["metadata"]["uid"]
    # Through the proxy: the delete takes its place among the operator's requests, as in a server's log.
    code, answer = await proxy.request("DELETE", f"{cluster.runs_path}/doomed")
    assert code == 200, answer
    deleted_at = next(
        i
        for i, r in enumerate(proxy.calls)
        if r.verb == "delete" and r.resource == "agentruns" and r.name == "doomed"
    )

    await until(lambda: run_gone(cluster, "doomed"), "the run to be deleted", timeout=WAIT)
    await until(
        lambda: transcript_collected(cluster, uid), "its transcript to be garbage-collected", timeout=90
    )
    after = proxy.calls[deleted_at + 1 :]
    late = [
        (r.method, r.path)
        for r in after
        if (r.resource == "agentruns" and r.subresource == "status" and r.verb != "get")
        or (r.resource == "secrets" and r.verb == "create")
    ]
    assert late == []


async def test_finished_runs_are_deleted_after_their_ttl_with_their_transcript(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, start_operator: OperatorFactory
) -> None:
    await start_operator()
    short = webhook_manifest(cluster, "short-lived", "[durable:plain]", webhook)
    # completionTime has whole seconds, so a TTL of n s may run out n-1 s after the run finishes: 5 s
    # leaves a loaded machine's polling time to read the finished run before it goes.
    short["spec"]["ttlSecondsAfterFinished"] = 5
    await request(cluster, "POST", cluster.runs_path, json=short)
    await request(
        cluster,
        "POST",
        cluster.runs_path,
        json=agentrun(
            "kept", "[durable:plain] y", namespace=cluster.namespace, model={"name": "claude-haiku-4-5"}
        ),
    )
    obj = await wait_finished(cluster, "short-lived")
    uid = obj["metadata"]["uid"]
    assert (await secret_transcript(cluster, uid)).chunks >= 1

    await until(lambda: run_gone(cluster, "short-lived"), "the run to be deleted after its TTL", timeout=WAIT)
    await until(
        lambda: transcript_collected(cluster, uid), "its transcript to be garbage-collected", timeout=90
    )
    kept = await wait_finished(cluster, "kept")
    assert kept["status"]["phase"] in ("Succeeded", "Failed")


async def test_the_operator_wide_ttl_applies_to_runs_that_set_none(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, start_operator: OperatorFactory
) -> None:
    await start_operator({"AGENTRUN_DEFAULT_TTL_SECONDS_AFTER_FINISHED": "1"})
    await request(
        cluster,
        "POST",
        cluster.runs_path,
        json=webhook_manifest(cluster, "default-ttl", "[durable:plain]", webhook),
    )

    await until(
        lambda: run_gone(cluster, "default-ttl"), "the run to be deleted by the default TTL", timeout=90
    )
    assert len(model.requests_for("[durable:plain]")) == 4, "it ran to the end first"
