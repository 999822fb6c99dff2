"""What asking a quota for room answers."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

#: The limits only a run with a sandbox is held back by (a run without one neither counts nor waits).
SANDBOX_LIMITS = frozenset({"concurrentSandboxes", "sandboxCPU", "sandboxMemory"})


@dataclass(frozen=True)
class Admitted:
    """The run counts against the quota now (or already did: admission is idempotent per uid)."""


@dataclass(frozen=True)
class Reserved:
    """The request's most possible cost is held; settle it after the answer."""


@dataclass(frozen=True)
class Blocked:
    #: concurrentRuns | runs | tokens | costUSD | concurrentSandboxes | sandboxCPU | sandboxMemory
    limit: str
    #: Names the quota "<namespace>/<name>", the limit, the usage and when room is expected.
    message: str
    #: When the window's usage frees enough; None when unknown (runs ending, requests settling).
    room_at: dt.datetime | None
    #: True: it can never fit (stop the run): a request even if every request in flight settled to
    #: nothing, a run's first request or its sandbox even in an empty quota. False: wait for room.
    final: bool = False
