"""The stuck-loop fault injection: nothing without its variable; with it, SIGUSR1 blocks the event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from agentrun.controller.replicas.faults import STALL_LOOP_VARIABLE, install_loop_stall


async def test_without_its_variable_nothing_is_installed() -> None:
    assert install_loop_stall({}) is None
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


async def test_sigusr1_blocks_the_event_loop_for_the_configured_seconds() -> None:
    uninstall = install_loop_stall({STALL_LOOP_VARIABLE: "0.3"})
    assert uninstall is not None
    try:
        loop = asyncio.get_running_loop()
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        timer: asyncio.Future[float] = loop.create_future()
        loop.call_later(0.01, lambda: timer.set_result(time.monotonic()))
        assert await timer - sent >= 0.3, "the timer fired while the loop should have been blocked"
    finally:
        uninstall()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


@pytest.mark.parametrize("value", ["soon", "0", "-2", "inf"])
async def test_a_bad_value_is_refused_in_one_line_and_nothing_is_installed(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert install_loop_stall({STALL_LOOP_VARIABLE: value}) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"{STALL_LOOP_VARIABLE}: {value!r} is not a positive number of seconds; not installed"
    ]
