"""Fault injection for tests: SIGUSR1 blocks the operator's event loop, as a stuck loop would.

Installed only when ``AGENTRUN_FAULT_STALL_LOOP_SECONDS`` is set (tests/integration/test_replicas.py
sets it); unset, nothing is installed and nothing of it runs. Why a blocking ``time.sleep`` on the
event loop: it is the fault itself (nothing else runs on that loop, while the membership's thread goes
on), which SIGSTOP is not (it stops the membership's thread too). Why a signal: the test picks the
moment, when the replica is in the middle of its runs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Mapping

__all__ = ["STALL_LOOP_VARIABLE", "install_loop_stall"]

logger = logging.getLogger(__name__)

STALL_LOOP_VARIABLE = "AGENTRUN_FAULT_STALL_LOOP_SECONDS"


def install_loop_stall(environ: Mapping[str, str] = os.environ) -> Callable[[], None] | None:
    """On the running loop, when the variable is set: returns what uninstalls it (None: not installed)."""
    value = environ.get(STALL_LOOP_VARIABLE)
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        logger.error("%s: %r is not a positive number of seconds; not installed", STALL_LOOP_VARIABLE, value)
        return None
    loop = asyncio.get_running_loop()

    def stall() -> None:
        logger.warning("fault injection (%s): blocking the event loop for %gs", STALL_LOOP_VARIABLE, seconds)
        time.sleep(seconds)
        logger.warning("fault injection (%s): the event loop runs again", STALL_LOOP_VARIABLE)

    loop.add_signal_handler(signal.SIGUSR1, stall)
    logger.warning(
        "fault injection (%s): SIGUSR1 blocks the event loop for %gs", STALL_LOOP_VARIABLE, seconds
    )

    def uninstall() -> None:
        loop.remove_signal_handler(signal.SIGUSR1)

    return uninstall
