"""The one way the tests wait: poll a readiness signal until it says yes, or fail saying what was seen.

Tests wait on what the system shows (a status, a request the fake model received, a metric), never
on a sleep long enough on a quiet machine. The timeout is only how long to go on looking before
failing: generous, because a loaded machine (a parallel run, CI next to an image build) is slow,
and a passing wait returns as soon as its signal is there.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[T] | T],
    what: str,
    timeout: float = 30.0,
    *,
    done: Callable[[T], object] = bool,
    every: float = 0.05,
    explain: Callable[[T], str] | None = None,
) -> T:
    """The first value of ``check()`` that ``done`` accepts (by default: the first true one).

    ``check`` may be a plain or an async function; it is asked every ``every`` seconds. After
    ``timeout`` seconds an AssertionError names ``what`` and the last value ``check`` returned,
    so a failure shows how far the system got (a phase, a message) rather than only that it
    did not get there; ``explain(last value)``, when given, says it instead (a summary, progress, logs).
    """
    deadline = time.monotonic() + timeout
    while True:
        value: Any = check()
        if inspect.isawaitable(value):
            value = await value
        if done(value):
            return value
        if time.monotonic() >= deadline:
            if explain is not None:
                seen = f"\n{explain(value)}"
            else:
                seen = "" if isinstance(value, bool) else f"; last seen: {_shortened(repr(value))}"
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{seen}")
        await asyncio.sleep(every)


def _shortened(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"
