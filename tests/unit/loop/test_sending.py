"""The one model-request loop (loop/sending.py): reserved, sent, backed off and clamped to the deadline.

Driven through the loop's own Protocols (a scripted ModelClient, an in-memory Allowance) on a fake
clock, so every delay and latency is exact; the step and the compaction that use it are covered end
to end through the real SDK in test_fault_matrix.py and test_context_management.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.api.stops import StopReason
from agentrun.api.usage import TokenUsage
from agentrun.loop.approving import ApprovalGate, NoApprover
from agentrun.loop.compacting import summarize
from agentrun.loop.config import LoopConfig, RetryPolicy
from agentrun.loop.context import Context, Interrupted
from agentrun.loop.dispatching import Dispatcher
from agentrun.loop.errors import FatalModelError, QuotaRefused, RetryableModelError, RetryClass
from agentrun.loop.events import ModelRequestFinished, ModelRetryScheduled
from agentrun.loop.protocols import ModelRequest, ModelResponse, Spend
from agentrun.loop.sending import Answered, RetriesExhausted, send_with_retries, unanswered
from agentrun.loop.state import RunState
from agentrun.loop.steps import Finish
from agentrun.model.pricing import PriceTable
from tests.support.allowances import MemoryAllowance
from tests.support.loop_harness import FakeClock, Recorder

RETRY = RetryPolicy(max_retries=3, base_seconds=1, max_seconds=8)  # backoff 1, 2, 4 s (jitter 0.5)
LATENCY = 2.0  # fake seconds each attempt takes at the model
USAGE = TokenUsage(input_tokens=100, output_tokens=20)
MODEL = "claude-sonnet-4-5"


def answer(text: str = "fine") -> ModelResponse:
    return ModelResponse([{"type": "text", "text": text}], "end_turn", USAGE, MODEL)


def overloaded(message: str = "overloaded", *, retry_after: float | None = None) -> RetryableModelError:
    return RetryableModelError(
        message, retry_class=RetryClass.OVERLOADED, status=529, retry_after=retry_after
    )


@dataclass
class ScriptedModel:
    """A ModelClient that answers from a list (an exception is raised), each attempt LATENCY long."""

    clock: FakeClock
    outcomes: list[ModelResponse | Exception]
    requests: list[ModelRequest] = field(default_factory=list)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        self.clock.now += LATENCY
        await asyncio.sleep(0)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


@dataclass
class WaitingAllowance(MemoryAllowance):
    """An allowance that makes each reservation wait `wait` fake seconds for room."""

    clock: FakeClock = field(default_factory=FakeClock)
    wait: float = 0.0

    async def reserve(self, spend: Spend) -> object:
        await self.clock.sleep(self.wait)
        return await super().reserve(spend)


@dataclass
class Harness:
    ctx: Context
    model: ScriptedModel
    clock: FakeClock
    recorder: Recorder

    def request(self) -> ModelRequest:
        return ModelRequest(model=MODEL, max_tokens=100, messages=self.ctx.state.messages)


def harness(
    *outcomes: ModelResponse | Exception,
    timeout: float = 600,
    allowance: MemoryAllowance | None = None,
    clock: FakeClock | None = None,
) -> Harness:
    clock = clock or FakeClock()
    config = LoopConfig.from_spec(
        AgentRunSpec.model_validate({"task": "t", "model": {"name": MODEL}}), run_id="run-uid", retry=RETRY
    )
    model, recorder = ScriptedModel(clock, list(outcomes)), Recorder()
    ctx = Context(
        config=config,
        model=model,
        tools={},
        observer=recorder,
        clock=clock,
        pricer=PriceTable(),
        cancel=asyncio.Event(),
        state=RunState.fresh("t"),
        dispatcher=Dispatcher({}, clock=clock, concurrency=1, timeout_seconds=1, max_result_chars=100),
        deadline=clock.monotonic() + timeout,
        gate=ApprovalGate(NoApprover(), clock, recorder, config.approval_timeout_seconds),
        allowance=allowance,
    )
    return Harness(ctx, model, clock, recorder)


async def test_transient_errors_are_retried_after_the_policy_backoff_and_the_answer_returned() -> None:
    h = harness(overloaded("first"), overloaded("second"), answer())
    sent = await send_with_retries(h.request(), h.ctx, iteration=4)
    assert sent == Answered(answer(), LATENCY)
    assert len(h.model.requests) == 3
    assert h.clock.sleeps == [1.0, 2.0]
    assert h.recorder.events == [
        ModelRequestFinished(4, MODEL, LATENCY, "overloaded"),
        ModelRetryScheduled(4, "overloaded", 1, 1.0, "first"),
        ModelRequestFinished(4, MODEL, LATENCY, "overloaded"),
        ModelRetryScheduled(4, "overloaded", 2, 2.0, "second"),
    ]  # the answer's own event is the caller's, told once it has recorded the answer


async def test_the_servers_retry_after_replaces_the_backoff() -> None:
    h = harness(overloaded(retry_after=7.0), answer())
    assert isinstance(await send_with_retries(h.request(), h.ctx, iteration=1), Answered)
    assert h.clock.sleeps == [7.0]


async def test_a_backoff_is_clamped_to_the_deadline_and_no_retry_is_sent_after_it() -> None:
    h = harness(overloaded(retry_after=30.0), answer(), timeout=10)
    with pytest.raises(Interrupted) as stopped:
        await send_with_retries(h.request(), h.ctx, iteration=1)
    assert stopped.value.reason is StopReason.TIMEOUT
    assert h.clock.sleeps == [10 - LATENCY]
    assert h.recorder.of(ModelRetryScheduled)[0].delay_seconds == 10 - LATENCY
    assert len(h.model.requests) == 1


async def test_after_the_last_retry_the_last_error_is_returned_with_the_number_of_attempts() -> None:
    errors = [overloaded(f"attempt {n}") for n in range(1, 5)]
    h = harness(*errors, answer())
    sent = await send_with_retries(h.request(), h.ctx, iteration=1)
    assert sent == RetriesExhausted(4, errors[-1])
    assert h.clock.sleeps == [1.0, 2.0, 4.0]
    assert [e.outcome for e in h.recorder.of(ModelRequestFinished)] == ["overloaded"] * 4
    assert len(h.recorder.of(ModelRetryScheduled)) == 3
    assert len(h.model.requests) == 4


async def test_a_fatal_error_is_returned_at_once_and_told_as_an_error() -> None:
    fatal = FatalModelError("invalid x-api-key", reason="AuthenticationFailed", status=401)
    h = harness(fatal, answer())
    assert await send_with_retries(h.request(), h.ctx, iteration=2) is fatal
    assert h.recorder.events == [ModelRequestFinished(2, MODEL, LATENCY, "error")]
    assert h.clock.sleeps == [] and len(h.model.requests) == 1


async def test_every_attempt_is_reserved_before_it_is_sent_and_settled_to_what_it_cost() -> None:
    allowance = MemoryAllowance()
    lost = RetryableModelError("reset", retry_class=RetryClass.CONNECTION)
    h = harness(lost, overloaded(), answer(), allowance=allowance)
    assert isinstance(await send_with_retries(h.request(), h.ctx, iteration=1), Answered)
    # No status: the API may have served it (charged in full); an HTTP error billed nothing.
    assert [r.usage for r in allowance.reservations] == [None, TokenUsage(), USAGE]
    assert all(r.spend.tokens > 0 for r in allowance.reservations)


async def test_a_request_that_does_not_fit_a_quota_is_returned_unsent() -> None:
    allowance = MemoryAllowance(refuse_from=0)
    h = harness(answer(), allowance=allowance)
    sent = await send_with_retries(h.request(), h.ctx, iteration=1)
    assert isinstance(sent, QuotaRefused) and "quota default/team" in sent.message
    assert h.model.requests == [] and h.recorder.events == []


async def test_a_wait_for_quota_room_is_not_counted_as_the_models_latency() -> None:
    clock = FakeClock()
    allowance = WaitingAllowance(clock=clock, wait=5.0)
    h = harness(overloaded(), answer(), allowance=allowance, clock=clock)
    sent = await send_with_retries(h.request(), h.ctx, iteration=1)
    assert sent == Answered(answer(), LATENCY)
    assert h.recorder.of(ModelRequestFinished)[0].duration_seconds == LATENCY
    assert clock.sleeps == [5.0, 1.0, 5.0]


async def test_a_summary_request_that_keeps_failing_ends_the_run_naming_the_summary_request() -> None:
    h = harness(*[overloaded("busy")] * 4)
    h.ctx.state.iterations = 6
    finished = await summarize(h.request(), h.ctx)
    assert isinstance(finished, Finish)
    assert finished.outcome.stop_reason is StopReason.MODEL_ERROR
    assert finished.outcome.condition_reason == "ModelRetriesExhausted"
    assert finished.outcome.message == (
        "the summary request for context compaction still failed after 4 attempts (overloaded): busy"
    )
    told = [*h.recorder.of(ModelRequestFinished), *h.recorder.of(ModelRetryScheduled)]
    assert len(told) == 7 and {e.iteration for e in told} == {6}  # a summary request is no iteration


async def test_a_summary_request_too_long_for_the_model_says_management_could_not_make_room() -> None:
    h = harness(FatalModelError("prompt is too long", status=400, context_window_exceeded=True))
    finished = await summarize(h.request(), h.ctx)
    assert isinstance(finished, Finish)
    assert finished.outcome.stop_reason is StopReason.CONTEXT_WINDOW_EXCEEDED
    assert (
        "the summary request itself was too long for the model: prompt is too long"
        in finished.outcome.message
    )


async def test_a_summary_answer_counts_in_usage_and_is_told_once() -> None:
    h = harness(overloaded(), answer("the summary"))
    response = await summarize(h.request(), h.ctx)
    assert response == answer("the summary")
    assert h.ctx.state.usage_by_model == {MODEL: USAGE}
    assert [e.outcome for e in h.recorder.of(ModelRequestFinished)] == ["overloaded", "ok"]
    assert h.ctx.state.iterations == 0


@pytest.mark.parametrize(
    ("request_words", "exhausted", "fatal"),
    [
        pytest.param(
            "",
            "model API still failing after 4 attempts (overloaded): busy",
            "HTTP 401: invalid x-api-key",
            id="the-step",
        ),
        pytest.param(
            "the summary request for context compaction",
            "the summary request for context compaction still failed after 4 attempts (overloaded): busy",
            "the summary request for context compaction failed: HTTP 401: invalid x-api-key",
            id="compaction",
        ),
    ],
)
def test_a_request_left_unanswered_ends_the_run_alike_for_every_caller_only_its_words_differ(
    request_words: str, exhausted: str, fatal: str
) -> None:
    def ended(sent: RetriesExhausted | FatalModelError | QuotaRefused) -> tuple[StopReason, str | None, str]:
        outcome = unanswered(sent, request=request_words).outcome
        return outcome.stop_reason, outcome.condition_reason, outcome.message

    assert ended(RetriesExhausted(4, overloaded("busy"))) == (
        StopReason.MODEL_ERROR,
        "ModelRetriesExhausted",
        exhausted,
    )
    refused_key = FatalModelError("invalid x-api-key", reason="AuthenticationFailed", status=401)
    assert ended(refused_key) == (StopReason.MODEL_ERROR, "AuthenticationFailed", fatal)
    assert ended(QuotaRefused("quota default/team: tokens 1000 of 1000 used")) == (
        StopReason.QUOTA_EXCEEDED,
        "QuotaExceeded",
        "quota default/team: tokens 1000 of 1000 used",
    )


async def _blocked(started: asyncio.Event, stopped: asyncio.Event | None = None) -> str:
    """Work that never answers: says when it has begun, and when it was stopped."""
    started.set()
    try:
        await asyncio.Event().wait()
    finally:
        if stopped is not None:
            stopped.set()
    return "never"


async def test_a_guarded_wait_ends_as_cancelled_when_the_signal_comes_and_the_work_is_stopped() -> None:
    ctx, started, stopped = harness().ctx, asyncio.Event(), asyncio.Event()
    waiting = asyncio.ensure_future(ctx.guarded(_blocked(started, stopped)))
    await started.wait()
    cast(asyncio.Event, ctx.cancel).set()
    with pytest.raises(Interrupted) as caught:
        await waiting
    assert caught.value.reason is StopReason.CANCELLED
    assert stopped.is_set()
    assert not ctx._guarding and not ctx._interrupted
    await ctx.close()


async def test_a_guarded_wait_ends_as_timed_out_at_the_deadline() -> None:
    ctx = harness(timeout=0.01).ctx
    with pytest.raises(Interrupted) as caught:
        await ctx.guarded(asyncio.Event().wait())
    assert caught.value.reason is StopReason.TIMEOUT
    await ctx.close()


async def test_work_started_after_the_signal_is_not_run_and_leaves_no_coroutine_unawaited() -> None:
    ctx, ran = harness().ctx, []

    async def work() -> None:
        ran.append(True)

    cast(asyncio.Event, ctx.cancel).set()
    with pytest.raises(Interrupted) as caught:
        await ctx.guarded(work())  # a coroutine never awaited would warn, and warnings are errors
    assert caught.value.reason is StopReason.CANCELLED
    assert ran == []


async def test_a_timeout_of_the_work_itself_and_its_answer_pass_through_unchanged() -> None:
    ctx = harness().ctx

    async def times_out() -> None:
        raise TimeoutError("the tool's own timeout")

    with pytest.raises(TimeoutError, match="the tool's own timeout"):
        await ctx.guarded(times_out())
    assert await ctx.guarded(asyncio.sleep(0, result="answer")) == "answer"
    await ctx.close()


async def test_the_callers_own_cancellation_propagates_and_is_not_taken_for_the_runs_cancel() -> None:
    ctx = harness().ctx
    started = asyncio.Event()
    waiting = asyncio.ensure_future(ctx.guarded(_blocked(started)))
    await started.wait()
    waiting.cancel()  # operator shutdown: the run resumes elsewhere, it is not cancelled
    with pytest.raises(asyncio.CancelledError):
        await waiting
    started.clear()
    both = asyncio.ensure_future(ctx.guarded(_blocked(started)))
    await started.wait()
    cast(asyncio.Event, ctx.cancel).set()  # the signal too, in the same turn: the shutdown still wins
    both.cancel()
    with pytest.raises(asyncio.CancelledError):
        await both
    await ctx.close()


async def test_closing_the_context_ends_the_task_that_waits_for_the_signal() -> None:
    ctx = harness().ctx
    assert await ctx.guarded(asyncio.sleep(0, result=1)) == 1
    watcher = ctx._watcher
    assert watcher is not None and not watcher.done()
    await ctx.close()
    assert watcher.cancelled() and ctx._watcher is None
