"""One model request sent until it is answered: reserved, sent, retried with backoff inside the deadline.

The one retry layer for the model (the SDK's own is off), used by the step that asks the model
(`requesting`) and by the summary request of a compaction (`compacting`), so both are retried,
reserved and bounded alike: every attempt is reserved against the run's quotas before it is sent
(`Context.reserved`) and told to the observers (`ModelRequestFinished`, and `ModelRetryScheduled`
before each backoff), and no backoff sleeps past the run's deadline.

A request that got no answer ends the run the same way for both (`unanswered`: QuotaExceeded or
ModelError, only the words naming the request differ). What else an outcome means differs between
the callers (what a context window overflow leads to, what an answer changes in the state), so
this returns it and leaves that to them; the answer's own ModelRequestFinished is theirs too, told
once they have recorded it.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.context import Context, Interrupted
from agentrun.loop.errors import FatalModelError, QuotaRefused, RetryableModelError
from agentrun.loop.events import ModelRequestFinished, ModelRetryScheduled
from agentrun.loop.protocols import ModelRequest, ModelResponse
from agentrun.loop.steps import Finish


@dataclass(frozen=True)
class Answered:
    """The model answered; ``elapsed`` is the answering attempt's latency (a wait for quota room
    before it is not the model's)."""

    response: ModelResponse
    elapsed: float


@dataclass(frozen=True)
class RetriesExhausted:
    """Every attempt the retry policy allows failed transiently; ``error`` is the last one's."""

    attempts: int
    error: RetryableModelError


Sent = Answered | RetriesExhausted | FatalModelError | QuotaRefused


async def send_with_retries(request: ModelRequest, ctx: Context, *, iteration: int) -> Sent:
    """Send ``request`` until it is answered, fails for good, or does not fit a quota (nothing sent).

    ``iteration`` is what the events of its attempts carry. Raises Interrupted on cancel or at the
    run's deadline (also when a backoff ends there: a retry sent then would be abandoned at once).
    """
    retry = ctx.config.retry
    attempt = 0
    while True:
        started = ctx.clock.monotonic()
        try:
            async with ctx.reserved(request) as meter:
                started = ctx.clock.monotonic()  # a wait for quota room is not the model's latency
                response = meter.response = await ctx.guarded(ctx.model.complete(request))
        except QuotaRefused as exc:
            return exc
        except RetryableModelError as exc:
            attempt += 1
            elapsed = ctx.clock.monotonic() - started
            await ctx.observer.notify(
                ModelRequestFinished(iteration, request.model, elapsed, exc.retry_class.value)
            )
            if attempt > retry.max_retries:
                return RetriesExhausted(attempt, exc)
            delay = exc.retry_after
            if delay is None:
                delay = retry.backoff(attempt, ctx.clock.random())
            # Never sleep past the deadline: the run would only wake up to time out.
            delay = max(0.0, min(delay, ctx.deadline - ctx.clock.monotonic()))
            await ctx.observer.notify(
                ModelRetryScheduled(iteration, exc.retry_class.value, attempt, delay, exc.message)
            )
            await ctx.guarded(ctx.clock.sleep(delay))
            if ctx.clock.monotonic() >= ctx.deadline:
                # A retry sent now would be abandoned at once; don't make the server do the work.
                raise Interrupted(StopReason.TIMEOUT) from exc
            continue
        except FatalModelError as exc:
            elapsed = ctx.clock.monotonic() - started
            await ctx.observer.notify(ModelRequestFinished(iteration, request.model, elapsed, "error"))
            return exc
        return Answered(response, ctx.clock.monotonic() - started)


def quota_exceeded(refused: QuotaRefused) -> Finish:
    """A request that does not fit a quota ends the run QuotaExceeded, whichever request it was."""
    return Finish(
        Outcome(StopReason.QUOTA_EXCEEDED, refused.message, condition_reason=refused.condition_reason)
    )


def unanswered(sent: RetriesExhausted | FatalModelError | QuotaRefused, *, request: str = "") -> Finish:
    """The end of a run whose model request got no answer: QuotaExceeded, or ModelError saying why.

    One place for the outcome both callers give a request that failed (the step and compaction's
    summary), so their stop reasons and condition reasons cannot drift apart; only ``request``, the
    words naming the request in the message ("" for the step's own), differs. A context window
    overflow is not handled here: what it leads to is the caller's (compaction, or why not).
    """
    if isinstance(sent, QuotaRefused):
        return quota_exceeded(sent)
    if isinstance(sent, RetriesExhausted):
        error = sent.error
        failing = f"{request} still failed" if request else "model API still failing"
        return Finish(
            Outcome(
                StopReason.MODEL_ERROR,
                f"{failing} after {sent.attempts} attempts ({error.retry_class.value}): {error.message}",
                condition_reason="ModelRetriesExhausted",
            )
        )
    status = f"HTTP {sent.status}: " if sent.status else ""
    failed = f"{request} failed: " if request else ""
    return Finish(
        Outcome(StopReason.MODEL_ERROR, f"{failed}{status}{sent.message}", condition_reason=sent.reason)
    )
