"""What asking a quota for room answers."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class Admitted:
    """The run counts against the quota now (or already did: admission is idempotent per uid)."""


@dataclass(frozen=True)
class Reserved:
    """The request's most possible cost is held; settle it after the answer."""


@dataclass(frozen=True)
class Blocked:
    #: concurrentRuns | runs | tokens | costUSD
    limit: str
    #: Names the quota "<namespace>/<name>", the limit, the usage and when room is expected.
    message: str
    #: When the window's usage frees enough; None when unknown (runs ending, requests settling).
    room_at: dt.datetime | None
    #: Reservations only. True: the request does not fit even if every request in flight settled
    #: to nothing (stop the run). False: it fits once reservations of others settle (wait).
    final: bool = False
