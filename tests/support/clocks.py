"""Time that only the test moves, for code that takes a clock and a sleep (the quota admission gate)."""

from __future__ import annotations

import asyncio
import datetime as dt


class ManualTime:
    """A wall clock (call it) and a `sleep` that returns once `advance()` has moved the clock past its end.

    A test moves time when it has seen what it waits for, so what a timer decides does not depend on
    how fast the machine is; `sleeping` says how long each pending sleep still has, the readiness
    signal that the code under test has done what it does before it waits.
    """

    def __init__(self, start: dt.datetime | None = None) -> None:
        self.now = start or dt.datetime.now(dt.UTC)
        self._ends: list[dt.datetime] = []
        self._moved = asyncio.Event()

    def __call__(self) -> dt.datetime:
        return self.now

    @property
    def sleeping(self) -> list[float]:
        """The seconds left of every pending sleep."""
        return [(end - self.now).total_seconds() for end in self._ends]

    async def sleep(self, seconds: float) -> None:
        end = self.now + dt.timedelta(seconds=seconds)
        self._ends.append(end)
        try:
            while self.now < end:
                moved = self._moved
                await moved.wait()
        finally:
            self._ends.remove(end)

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
