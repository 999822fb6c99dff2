"""The one retry policy for the operator's own Kubernetes writes (status, transcript chunks).

Why one: the status writer and the transcript store each had a loop with its own attempts and its
own idea of a transient failure. Now the error says whether a retry can help (``retryable``) and how
long the server wants us to wait (``retry_after``, kube/errors.py); this module says how often and
how long otherwise, from the operator's settings (``AGENTRUN_KUBE_RETRY_*``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from agentrun.kube.errors import APIError

if TYPE_CHECKING:
    from agentrun.settings import Settings

__all__ = ["DEFAULT_RETRY_POLICY", "KubeRetryPolicy", "RetriesStopped", "retried"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


#: The longest wait a Retry-After header can impose on one retry.
RETRY_AFTER_LIMIT_SECONDS = 60.0


@dataclass(frozen=True)
class KubeRetryPolicy:
    """Up to ``attempts`` retries; retry n waits ``first_seconds`` × ``factor``ⁿ, at most ``max_seconds``.

    The defaults are the operator's (Settings ``kube_retry_*``): 8 retries, 0.2 s doubling up to 5 s, about
    21 s in all, as patient as the most patient of the two loops this replaced (status 5, transcript 8).
    """

    attempts: int = 8
    first_seconds: float = 0.2
    max_seconds: float = 5.0
    factor: float = 2.0

    @classmethod
    def from_settings(cls, settings: Settings) -> KubeRetryPolicy:
        return cls(
            attempts=settings.kube_retry_attempts,
            first_seconds=settings.kube_retry_first_seconds,
            max_seconds=settings.kube_retry_max_seconds,
        )

    def delay(self, retry: int, error: APIError) -> float:
        """The wait before retry number ``retry`` (0-based): what the server asked for, else the backoff."""
        if error.retry_after is not None:
            # The server knows its load best, but a run must not freeze on one absurd header.
            return min(error.retry_after, RETRY_AFTER_LIMIT_SECONDS)
        return float(min(self.first_seconds * self.factor**retry, self.max_seconds))


#: For callers built without Settings (tests, `agentrun run`): the same numbers as the Settings defaults.
DEFAULT_RETRY_POLICY = KubeRetryPolicy()


class RetriesStopped(Exception):
    """The run is being stopped (deleted, or the operator shuts down) before the call could succeed."""


async def retried(
    request: Callable[[], Awaitable[T]],
    policy: KubeRetryPolicy,
    *,
    what: str,
    stopping: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """``request()`` until it succeeds, a failure is not retryable, or the policy's attempts are spent.

    The last failure is raised as it is (a typed APIError). :class:`RetriesStopped` is raised instead
    of trying (again) once ``stopping()`` says so: a run being stopped has no more writes to make.
    ``what`` names the call in the warning logged before each retry.
    """
    retry = 0
    while True:
        if stopping():
            raise RetriesStopped(f"{what}: not done, the run is being stopped")
        try:
            return await request()
        except APIError as exc:
            if not exc.retryable or retry >= policy.attempts:
                raise
            delay = policy.delay(retry, exc)
            logger.warning(
                "%s failed (%s); retry %d of %d in %.1fs", what, exc, retry + 1, policy.attempts, delay
            )
        await sleep(delay)
        retry += 1
