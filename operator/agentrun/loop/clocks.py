"""The real clock; tests inject their own to control time and jitter."""

from __future__ import annotations

import asyncio
import random
import time


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def random(self) -> float:
        return random.random()
