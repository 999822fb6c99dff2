"""Fault injection for tests: SIGUSR1 blocks the operator's event loop, as a stuck loop would.

Installed only when ``Settings.fault.stall_loop_seconds`` is set (AGENTRUN_FAULT_STALL_LOOP_SECONDS,
which tests/integration/test_replicas.py and the node tier set); unset, the default, nothing is
installed and nothing of it runs. Why a blocking ``time.sleep`` on the event loop: it is the fault itself
(nothing else runs on that loop, while the membership's thread goes on), which SIGSTOP is not (it stops
the membership's thread too). Why a signal: the test picks the moment, when the replica is in the middle
of its runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

__all__ = ["install_loop_stall"]

logger = logging.getLogger(__name__)


def install_loop_stall(seconds: float | None) -> Callable[[], None] | None:
    """On the running loop, when ``seconds`` is set: returns what uninstalls it (None: not installed)."""
    if seconds is None:
        return None
    loop = asyncio.get_running_loop()

    def stall() -> None:
        logger.warning("fault injection (stall_loop_seconds): blocking the event loop for %gs", seconds)
        time.sleep(seconds)
        logger.warning("fault injection (stall_loop_seconds): the event loop runs again")

    loop.add_signal_handler(signal.SIGUSR1, stall)
    logger.warning("fault injection (stall_loop_seconds): SIGUSR1 blocks the event loop for %gs", seconds)

    def uninstall() -> None:
        loop.remove_signal_handler(signal.SIGUSR1)

    return uninstall
