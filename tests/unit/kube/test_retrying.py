"""The one retry policy: only retryable errors, the server's Retry-After, a stop, backoff from Settings."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentrun.kube.errors import (
    APIConflictError,
    APIError,
    APIForbiddenError,
    APIServerError,
    APITooManyRequestsError,
    APITransportError,
)
from agentrun.kube.retrying import (
    DEFAULT_RETRY_POLICY,
    RETRY_AFTER_LIMIT_SECONDS,
    KubeRetryPolicy,
    RetriesStopped,
    retried,
)
from agentrun.settings import Settings


class FakeSleep:
    """Records each wait instead of waiting: no test here sleeps for real."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


class Script:
    """A call that fails with the given errors, in order, then answers "done"."""

    def __init__(self, *failures: APIError) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


def server_error() -> APIServerError:
    return APIServerError("etcd leader changed", status=500, reason="InternalError")


async def run(
    script: Script, policy: KubeRetryPolicy, stopping: Callable[[], bool] = lambda: False
) -> FakeSleep:
    sleep = FakeSleep()
    assert await retried(script, policy, what="test call", stopping=stopping, sleep=sleep) == "done"
    return sleep


async def test_retryable_failures_are_retried_with_a_doubling_backoff_capped_at_the_maximum() -> None:
    script = Script(
        server_error(),
        APITransportError("connection reset"),
        APIConflictError("modified", status=409, reason="Conflict"),
        server_error(),
        server_error(),
    )
    sleep = await run(script, KubeRetryPolicy(attempts=8, first_seconds=0.5, max_seconds=3.0))
    assert sleep.waits == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert script.calls == 6


async def test_a_failure_no_retry_can_help_is_raised_at_once() -> None:
    script = Script(APIForbiddenError("RBAC says no", status=403, reason="Forbidden"))
    sleep = FakeSleep()
    with pytest.raises(APIForbiddenError, match="RBAC says no"):
        await retried(script, DEFAULT_RETRY_POLICY, what="test call", sleep=sleep)
    assert script.calls == 1 and sleep.waits == []


async def test_the_servers_retry_after_is_waited_instead_of_the_backoff() -> None:
    script = Script(
        APITooManyRequestsError("slow down", status=429, reason="TooManyRequests", retry_after=4.0)
    )
    sleep = await run(script, KubeRetryPolicy(attempts=3, first_seconds=0.2, max_seconds=1.0))
    assert sleep.waits == [4.0]


async def test_an_absurd_retry_after_is_bounded_so_a_run_never_freezes_on_one_header() -> None:
    script = Script(
        APITooManyRequestsError("slow down", status=429, reason="TooManyRequests", retry_after=86400.0)
    )
    sleep = await run(script, KubeRetryPolicy(attempts=3, first_seconds=0.2, max_seconds=1.0))
    assert sleep.waits == [RETRY_AFTER_LIMIT_SECONDS]


async def test_the_last_failure_is_raised_once_the_attempts_are_spent() -> None:
    script = Script(*[server_error() for _ in range(10)])
    sleep = FakeSleep()
    with pytest.raises(APIServerError, match="etcd leader changed"):
        await retried(
            script, KubeRetryPolicy(attempts=3, first_seconds=1.0, max_seconds=10.0), what="x", sleep=sleep
        )
    assert script.calls == 4, "the first try and three retries"
    assert sleep.waits == [1.0, 2.0, 4.0]


async def test_a_run_being_stopped_ends_the_retries_without_another_call() -> None:
    stopped = False

    def stopping() -> bool:
        return stopped

    class StopAfterFirstFailure(FakeSleep):
        async def __call__(self, seconds: float) -> None:
            nonlocal stopped
            await super().__call__(seconds)
            stopped = True

    script = Script(server_error(), server_error())
    sleep = StopAfterFirstFailure()
    with pytest.raises(RetriesStopped):
        await retried(script, DEFAULT_RETRY_POLICY, what="x", stopping=stopping, sleep=sleep)
    assert script.calls == 1 and sleep.waits == [0.2]

    untouched = Script()
    with pytest.raises(RetriesStopped):
        await retried(untouched, DEFAULT_RETRY_POLICY, what="x", stopping=lambda: True, sleep=FakeSleep())
    assert untouched.calls == 0


async def test_attempts_and_backoff_come_from_the_operators_settings() -> None:
    settings = Settings.from_env(
        {
            "AGENTRUN_KUBE_RETRY_ATTEMPTS": "2",
            "AGENTRUN_KUBE_RETRY_FIRST_SECONDS": "1.5",
            "AGENTRUN_KUBE_RETRY_MAX_SECONDS": "2",
        }
    )
    policy = KubeRetryPolicy.from_settings(settings)
    assert policy == KubeRetryPolicy(attempts=2, first_seconds=1.5, max_seconds=2.0)
    script = Script(server_error(), server_error(), server_error())
    sleep = FakeSleep()
    with pytest.raises(APIServerError):
        await retried(script, policy, what="x", sleep=sleep)
    assert sleep.waits == [1.5, 2.0]


def test_the_default_policy_is_the_settings_default_and_as_patient_as_the_loops_it_replaced() -> None:
    policy = KubeRetryPolicy.from_settings(Settings())
    assert policy == DEFAULT_RETRY_POLICY
    assert policy.attempts >= 8, "the transcript store retried 8 times, the status writer 5"
    assert [policy.delay(n, server_error()) for n in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
