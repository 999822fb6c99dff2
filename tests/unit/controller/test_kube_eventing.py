"""Kubernetes Events on AgentRuns, posted through the real kubernetes_asyncio client to the emulator."""

from __future__ import annotations

import asyncio
import logging
from decimal import Decimal
from typing import Any

import pytest
from kubernetes_asyncio import client

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.api.usage import TokenUsage
from agentrun.controller.kube_eventing import (
    MAX_MESSAGE_CHARS,
    InvolvedRun,
    KubeEventSink,
    RunEvents,
    bounded,
)
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIForbiddenError
from agentrun.loop.events import (
    ApprovalDecided,
    ApprovalRequested,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    RunStarted,
)

RUN = InvolvedRun("default", "my-run", "0b6c7d1e-uid")
#: The replica name (Settings.replica_name) the Events report as their instance.
INSTANCE = "agentrun-operator-7d9f-x2"
PROGRESS = Progress(3, 2, TokenUsage(100, 20), Decimal("0.0012"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _events(core: client.CoreV1Api) -> list[Any]:
    items = (await core.list_namespaced_event("default")).items
    return sorted(items, key=lambda e: e.metadata.name)


def _retry(attempt: int, retry_class: str = "rate_limited", message: str = "429 Too Many Requests") -> Any:
    return ModelRetryScheduled(1, retry_class, attempt, 1.0, message)


async def test_a_fresh_start_posts_no_event_and_the_terminal_outcome_is_an_event_on_the_run(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    events = RunEvents(KubeEventSink(KubeClient(api_client)), RUN, instance=INSTANCE)
    await events.notify(RunStarted(resumed=False, progress=Progress(0, 0, TokenUsage(), None)))
    assert await _events(core) == []
    await events.notify(RunFinished(Outcome(StopReason.END_TURN, "the model finished its answer"), PROGRESS))
    [finished] = await _events(core)
    assert (finished.type, finished.reason) == ("Normal", "EndTurn")
    assert finished.message == "the model finished its answer (3 iterations, 120 tokens, $0.001200)"
    for event in (finished,):
        ref = event.involved_object
        assert (ref.api_version, ref.kind, ref.namespace, ref.name, ref.uid) == (
            "agentrun.dev/v1alpha1",
            "AgentRun",
            "default",
            "my-run",
            "0b6c7d1e-uid",
        )
        assert event.source.component == "agentrun-operator"
        assert (event.reporting_component, event.reporting_instance) == ("agentrun-operator", INSTANCE)
        assert event.count == 1


async def test_a_resumed_run_is_an_event_that_says_how_far_it_had_come(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    events = RunEvents(KubeEventSink(KubeClient(api_client)), RUN, instance=INSTANCE)
    await events.notify(RunStarted(resumed=True, progress=PROGRESS))
    await events.settled()
    [resumed] = await _events(core)
    assert (resumed.type, resumed.reason) == ("Normal", "Resumed")
    assert resumed.message == "resumed from its checkpoint after 3 iterations"


async def test_a_resume_does_not_wait_for_its_event_and_the_terminal_event_comes_after_it() -> None:
    """Resumes come in bursts when a replica's runs are taken over: the run's next model request must
    not wait for a busy API server to take its Event."""

    class Slow:
        def __init__(self) -> None:
            self.release = asyncio.Event()
            self.posted: list[str] = []

        async def create(self, namespace: str, body: dict[str, Any]) -> None:
            if body["reason"] == "Resumed":
                await self.release.wait()
            self.posted.append(body["reason"])

        async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
            self.posted.append("patch")

    sink = Slow()
    events = RunEvents(sink, RUN, instance=INSTANCE)
    await asyncio.wait_for(events.notify(RunStarted(resumed=True, progress=PROGRESS)), 1)
    assert sink.posted == []
    finishing = asyncio.create_task(
        events.notify(RunFinished(Outcome(StopReason.END_TURN, "done"), PROGRESS))
    )
    await asyncio.sleep(0.05)
    assert not finishing.done() and sink.posted == []  # the terminal Event waits for the resume's
    sink.release.set()
    await asyncio.wait_for(finishing, 1)
    assert sink.posted == ["Resumed", "EndTurn"]


async def test_a_failed_run_ends_with_a_warning_named_after_its_stop_reason(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    events = RunEvents(KubeEventSink(KubeClient(api_client)), RUN, instance=INSTANCE)
    await events.notify(RunFinished(Outcome(StopReason.LOOP_DETECTED, "the same call repeated"), PROGRESS))
    [event] = await _events(core)
    assert (event.type, event.reason) == ("Warning", "LoopDetected")


async def test_repeated_retries_bump_the_count_of_one_event(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    events = RunEvents(KubeEventSink(KubeClient(api_client)), RUN, instance=INSTANCE)
    for attempt in (1, 2, 3):
        await events.notify(_retry(attempt))
    await events.notify(_retry(1, "overloaded", "529 overloaded"))
    await events.notify(ModelRequestFinished(2, "claude-haiku-4-5", 0.2, "error"))
    by_reason: dict[str, list[Any]] = {}
    for event in await _events(core):
        by_reason.setdefault(event.reason, []).append(event)
    rate_limited, overloaded = sorted(by_reason["ModelRetry"], key=lambda e: e.count, reverse=True)
    assert rate_limited.count == 3 and "retry 3 scheduled" in rate_limited.message
    assert rate_limited.type == "Warning"
    assert overloaded.count == 1 and "(overloaded)" in overloaded.message
    [error] = by_reason["ModelError"]
    assert error.type == "Warning" and "claude-haiku-4-5" in error.message


async def test_events_beyond_the_burst_are_dropped_until_the_bucket_refills_and_the_end_says_so(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    clock = Clock()
    events = RunEvents(
        KubeEventSink(KubeClient(api_client)), RUN, instance=INSTANCE, clock=clock, burst=2, refill_seconds=10
    )
    for call in ("toolu_1", "toolu_2", "toolu_3", "toolu_4"):
        await events.notify(ApprovalDecided(1, call, "deploy", True, "alice", None, False, 1.0))
    assert len(await _events(core)) == 2
    clock.now = 10.0
    await events.notify(ApprovalDecided(1, "toolu_5", "deploy", False, "bob", "not today", False, 1.0))
    await events.notify(RunFinished(Outcome(StopReason.CANCELLED, "spec.cancel was set"), PROGRESS))
    posted = await _events(core)
    assert [e.reason for e in posted] == ["ApprovalDecided"] * 3 + ["Cancelled"]
    assert posted[2].message == "tool call deploy (toolu_5) was denied by bob: not today"
    assert posted[3].message.endswith("; 2 earlier events were rate-limited")


async def test_approval_requests_are_never_rate_limited_and_never_show_the_tool_input(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    events = RunEvents(KubeEventSink(KubeClient(api_client)), RUN, instance=INSTANCE, burst=1)
    for n in range(3):
        await events.notify(
            ApprovalRequested(1, f"toolu_{n}", "kubectl_delete", {"name": "prod-db-password"})
        )
    posted = await _events(core)
    assert [e.reason for e in posted] == ["ApprovalRequested"] * 3
    assert all("prod-db" not in e.message for e in posted)


async def test_a_count_bumped_while_rate_limited_is_written_before_the_terminal_event(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    events = RunEvents(
        KubeEventSink(KubeClient(api_client)),
        RUN,
        instance=INSTANCE,
        clock=Clock(),
        burst=1,
        refill_seconds=60,
    )
    for attempt in (1, 2, 3, 4):
        await events.notify(_retry(attempt))
    await events.notify(RunFinished(Outcome(StopReason.MODEL_ERROR, "still failing"), PROGRESS))
    retry = next(e for e in await _events(core) if e.reason == "ModelRetry")
    assert retry.count == 4


async def test_a_failing_events_api_never_fails_the_run(cluster: Any, api_client: client.ApiClient) -> None:
    class Broken:
        def __init__(self) -> None:
            self.attempts: list[str] = []

        async def create(self, namespace: str, body: dict[str, Any]) -> None:
            self.attempts.append(body["reason"])
            raise APIForbiddenError("events are forbidden", status=403, reason="Forbidden")

        async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
            self.attempts.append("patch")
            raise APIForbiddenError("events are forbidden", status=403, reason="Forbidden")

    sink = Broken()
    events = RunEvents(sink, RUN, instance=INSTANCE)
    await events.notify(RunStarted(resumed=True, progress=PROGRESS))
    await events.notify(RunFinished(Outcome(StopReason.END_TURN, "done"), PROGRESS))
    # Both Events were attempted, both refused, and neither refusal escaped into the run.
    assert sink.attempts == ["Resumed", "EndTurn"]


async def test_an_event_post_that_times_out_is_logged_as_a_timeout_and_never_fails_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Silent:
        async def create(self, namespace: str, body: dict[str, Any]) -> None:
            await asyncio.sleep(30)  # an API server that never answers

        async def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
            await asyncio.sleep(30)

    events = RunEvents(Silent(), RUN, instance=INSTANCE, post_timeout=0.05)
    with caplog.at_level(logging.WARNING, logger="agentrun.controller.kube_eventing"):
        await events.notify(RunFinished(Outcome(StopReason.END_TURN, "done"), PROGRESS))
    assert [r.getMessage() for r in caplog.records] == [
        "could not post a Kubernetes Event (further failures not logged): "
        "no answer from the API server within 0.05 s"
    ]


def test_messages_are_scrubbed_of_credentials_and_bounded() -> None:
    message = bounded(
        "401: invalid x-api-key sk-ant-api03-abcdefghijklmnop; Authorization: Bearer abc.def "
        'api_key="hunter2" token=s3cret ' + "x" * 2000
    )
    for secret in ("sk-ant-api03", "abc.def", "hunter2", "s3cret"):
        assert secret not in message
    assert "[redacted]" in message
    assert len(message) == MAX_MESSAGE_CHARS and message.endswith("…")
