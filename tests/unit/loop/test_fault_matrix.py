"""Model API fault matrix: every fault class against the fake Messages API, through the direct client,
the real SDK, and the SDK streaming every request.

Each case states the documented behaviour (docs/stop-reasons.md, "Model API errors and retries"): how many
requests the server sees, how long the loop sleeps between them (virtual time), the final
stopReason and condition reason, the retries counted by class, and that retries never spend
budget. Backoff is 1, 2, 4 s for attempts 1..3 here (jitter pinned to the middle of its range).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
from prometheus_client import CollectorRegistry

from agentrun.api.status_patches import finished
from agentrun.api.stops import StopReason
from agentrun.loop.config import RetryPolicy
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.script import (
    ConnectionReset,
    Fault,
    HttpError,
    Reply,
    ScriptUsage,
    SlowResponse,
    Step,
    StreamError,
    TruncatedStream,
    text_block,
)
from tests.support.loop_harness import FakeClock, run_scripted

RETRY = RetryPolicy(max_retries=3, base_seconds=1, max_seconds=8)
USAGE = ScriptUsage(100, 20)
TOKEN_BUDGET = 1000
COST_BUDGET = 0.01
CLASSES = ("rate_limited", "overloaded", "server_error", "connection", "timeout")


@dataclass(frozen=True)
class Case:
    step: Step
    requests: int
    sleeps: list[float]
    stop: StopReason
    condition: str
    retries: dict[str, int] = field(default_factory=dict)
    message: str | None = None  # a piece of the API's own message that must reach status
    timeout: int | None = None


def answer_after(*faults: Fault) -> Reply:
    return Reply([text_block("fine")], usage=USAGE, faults=faults)


def end_turn(requests: int, sleeps: list[float], **retries: int) -> Case:
    return Case(answer_after(), requests, sleeps, StopReason.END_TURN, "EndTurn", retries)


def replace_step(case: Case, *faults: Fault) -> Case:
    return Case(answer_after(*faults), case.requests, case.sleeps, case.stop, case.condition, case.retries)


def fatal(fault: HttpError, condition: str, stop: StopReason = StopReason.MODEL_ERROR) -> Case:
    return Case(fault, 1, [], stop, condition, {}, fault.error_message)


def exhausted(fault: Fault, retry_class: str) -> Case:
    return Case(fault, 4, [1, 2, 4], StopReason.MODEL_ERROR, "ModelRetriesExhausted", {retry_class: 3})


CASES: dict[str, Case] = {
    "429 with retry-after is retried after exactly that long": replace_step(
        end_turn(3, [7, 7], rate_limited=2), HttpError.rate_limit(retry_after=7, times=2)
    ),
    "429 with retry-after-ms is retried after that many milliseconds": replace_step(
        end_turn(2, [1.5], rate_limited=1), HttpError.rate_limit(retry_after=None, retry_after_ms=1500)
    ),
    "429 without retry-after backs off exponentially": replace_step(
        end_turn(3, [1, 2], rate_limited=2), HttpError.rate_limit(retry_after=None, times=2)
    ),
    "429 with retry-after beyond the timeout waits only until the timeout": Case(
        answer_after(HttpError.rate_limit(retry_after=120)),
        1,
        [30],
        StopReason.TIMEOUT,
        "Timeout",
        {"rate_limited": 1},
        timeout=30,
    ),
    "429 that never clears runs out of retries": exhausted(
        HttpError(error_type="rate_limit_error"), "rate_limited"
    ),
    "529 overloaded is retried with backoff": replace_step(
        end_turn(3, [1, 2], overloaded=2), HttpError.overloaded(times=2)
    ),
    "529 overloaded that never clears runs out of retries": exhausted(HttpError.overloaded(), "overloaded"),
    "500 is retried": replace_step(end_turn(2, [1], server_error=1), HttpError(error_type="api_error")),
    "503 is retried": replace_step(
        end_turn(3, [1, 2], server_error=2), HttpError(error_type="api_error", status=503, times=2)
    ),
    "500 that never clears runs out of retries": exhausted(HttpError(error_type="api_error"), "server_error"),
    "overloaded error inside a 200 stream is retried": replace_step(
        end_turn(3, [1, 2], overloaded=2), StreamError(times=2)
    ),
    "connection reset before the headers is retried": replace_step(
        end_turn(2, [1], connection=1), ConnectionReset(during="headers")
    ),
    "connection reset inside the stream is retried": replace_step(
        end_turn(2, [1], connection=1), ConnectionReset(during="body")
    ),
    "connection reset every time runs out of retries": exhausted(ConnectionReset(), "connection"),
    "stream cut before message_stop is retried": replace_step(
        end_turn(2, [1], connection=1), TruncatedStream(mode="cut")
    ),
    "response slower than the run's timeout ends the run at the timeout": Case(
        answer_after(SlowResponse(seconds=60)), 1, [], StopReason.TIMEOUT, "Timeout", timeout=1
    ),
    "400 is not retried": fatal(
        HttpError(error_type="invalid_request_error", message="messages.0: bad block"), "InvalidModelRequest"
    ),
    "400 prompt too long ends as context window exceeded": fatal(
        HttpError(error_type="invalid_request_error", message="prompt is too long: 210000 tokens > 200000"),
        "ContextWindowExceeded",
        StopReason.CONTEXT_WINDOW_EXCEEDED,
    ),
    "401 is not retried and fails authentication": fatal(
        HttpError(error_type="authentication_error"), "AuthenticationFailed"
    ),
    "403 is not retried and fails authentication": fatal(
        HttpError(error_type="permission_error"), "AuthenticationFailed"
    ),
    "404 is not retried": fatal(
        HttpError(error_type="not_found_error", message="model: claude-nope"), "ModelNotFound"
    ),
    "413 is not retried": fatal(HttpError(error_type="request_too_large"), "RequestTooLarge"),
    "422 is not retried": fatal(
        HttpError(error_type="invalid_request_error", status=422, message="unprocessable"),
        "InvalidModelRequest",
    ),
    "spend limit as a 400 is not retried": fatal(
        HttpError(
            error_type="invalid_request_error",
            message="You have reached your specified workspace API usage limits.",
        ),
        "SpendLimitReached",
    ),
    "spend limit as a 402 billing error is not retried": fatal(
        HttpError(error_type="billing_error"), "SpendLimitReached"
    ),
    "429 marked x-should-retry false is not retried": Case(
        HttpError(error_type="rate_limit_error", headers={"x-should-retry": "false"}),
        1,
        [],
        StopReason.MODEL_ERROR,
        "RateLimited",
    ),
}


#: How the request goes: without streaming through the direct client (the default) or the SDK
#: (AGENTRUN_MODEL_CLIENT=sdk), or streamed through the SDK.
PATHS = {"direct client": ("direct", False), "SDK": ("sdk", False), "every request streamed": ("sdk", True)}


@pytest.mark.parametrize("path", PATHS.values(), ids=list(PATHS))
@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
async def test_model_api_fault(case: Case, path: tuple[Literal["direct", "sdk"], bool]) -> None:
    client, always_stream = path
    registry = CollectorRegistry()
    metrics = MetricsObserver(Metrics(registry), namespace="default", started_monotonic=0.0)
    clock = FakeClock()
    limits: dict[str, object] = {"tokenBudget": TOKEN_BUDGET, "costBudgetUSD": COST_BUDGET}
    if case.timeout is not None:
        limits["timeoutSeconds"] = case.timeout
    run = await run_scripted(
        [case.step],
        spec={"model": {"name": "claude-haiku-4-5"}, "limits": limits},
        retry=RETRY,
        clock=clock,
        observers=[metrics],
        always_stream=always_stream,
        client=client,
    )

    assert run.outcome.stop_reason is case.stop, run.outcome.message
    assert len(run.requests) == case.requests
    assert clock.sleeps == case.sleeps
    status = finished(run.outcome, run.finished.progress, now="t", generation=None).body()
    reasons = {c["type"]: c["reason"] for c in status["conditions"]}
    assert reasons["Succeeded"] == case.condition
    if case.message is not None:
        assert case.message in status["message"]
    counted = {
        c: int(registry.get_sample_value("agentrun_model_retries_total", {"retry_class": c}) or 0)
        for c in CLASSES
    }
    assert counted == {c: case.retries.get(c, 0) for c in CLASSES}

    # Failed attempts spend nothing: usage is exactly the answers received, within both budgets.
    progress = run.finished.progress
    answered = 1 if case.stop is StopReason.END_TURN else 0
    assert progress.usage.total == answered * (100 + 20) <= TOKEN_BUDGET
    cost = PriceTable().cost("claude-haiku-4-5", progress.usage)
    assert cost is not None and cost <= COST_BUDGET
    assert progress.iterations == answered
