"""The stuck-loop fault injection: off unless its setting is set; with it, SIGUSR1 blocks the event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from pydantic import ValidationError

from agentrun.controller.replicas.faults import install_loop_stall
from agentrun.settings import Settings, describe_settings_error

VARIABLE = "AGENTRUN_FAULT_STALL_LOOP_SECONDS"


def test_every_fault_is_off_unless_its_variable_is_set() -> None:
    assert Settings.from_env({}).fault.stall_loop_seconds is None
    assert Settings().fault.stall_loop_seconds is None


def test_the_stall_is_set_by_its_documented_variable() -> None:
    assert Settings.from_env({VARIABLE: "0.3"}).fault.stall_loop_seconds == 0.3


async def test_without_its_setting_nothing_is_installed() -> None:
    assert install_loop_stall(Settings.from_env({}).fault.stall_loop_seconds) is None
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


async def test_sigusr1_blocks_the_event_loop_for_the_configured_seconds() -> None:
    uninstall = install_loop_stall(Settings.from_env({VARIABLE: "0.3"}).fault.stall_loop_seconds)
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


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("soon", "Input should be a valid number, unable to parse string as a number"),
        ("0", "Input should be greater than 0"),
        ("-2", "Input should be greater than 0"),
        ("inf", "Input should be a finite number"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_variable(value: str, said: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings.from_env({VARIABLE: value})
    assert describe_settings_error(caught.value) == f"{VARIABLE}: {said}"
