"""``python -m bench.profiled_operator PROFILE ARGS...``: the operator under cProfile with a CPU-time clock.

``python -m cProfile`` measures wall time, so on a loaded machine a function preempted by the kernel looks
expensive; ``time.process_time`` counts only the CPU this process used. Profiling starts on SIGUSR1, so
the benchmark can leave out startup (imports, login) and profile only the runs; stats are written on exit.
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from types import FrameType

from agentrun.cli.main import main


def run(argv: list[str]) -> int:
    path, args = argv[0], argv[1:]
    profile = cProfile.Profile(time.process_time)

    def start(signum: int, frame: FrameType | None) -> None:
        profile.enable()

    signal.signal(signal.SIGUSR1, start)
    try:
        return main(args)
    finally:
        profile.disable()
        profile.dump_stats(path)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
