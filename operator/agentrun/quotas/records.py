"""The entries of a quota's ledger: what a status holds, as values.

Frozen so that a working copy can be changed only through the ledger's operations, whose rules
(idempotence, fitting, charging in full) are the whole point of keeping it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal

ZERO = Decimal(0)


@dataclass(frozen=True)
class Tally:
    """Runs started, tokens and dollars counted against a quota: one bucket's, or a whole window's."""

    runs: int = 0
    tokens: int = 0
    cost_usd: Decimal = ZERO

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.runs + other.runs, self.tokens + other.tokens, self.cost_usd + other.cost_usd)

    def __sub__(self, other: Tally) -> Tally:
        return Tally(self.runs - other.runs, self.tokens - other.tokens, self.cost_usd - other.cost_usd)

    @property
    def empty(self) -> bool:
        return self.runs == 0 and self.tokens == 0 and self.cost_usd == 0


@dataclass(frozen=True)
class SandboxUse:
    """The sandbox an admitted run holds, by its limits: what concurrentSandboxes, sandboxCPU and
    sandboxMemory count (cores and bytes, exact)."""

    cpu: Decimal = ZERO
    memory: Decimal = ZERO


@dataclass(frozen=True)
class AdmittedRun:
    uid: str
    name: str
    at: dt.datetime
    #: None for a run without a sandbox: it counts in concurrentRuns only.
    sandbox: SandboxUse | None = None


@dataclass(frozen=True)
class Reservation:
    """The most one model request in flight may still cost, held until it is settled or charged."""

    uid: str
    name: str
    id: str
    holder: str
    tokens: int
    cost_usd: Decimal
    at: dt.datetime


@dataclass(frozen=True)
class Lost:
    """Reservations charged in full because the process holding them stopped before the answer."""

    requests: int = 0
    tokens: int = 0
    cost_usd: Decimal = ZERO


@dataclass(frozen=True)
class Refused:
    runs: int = 0
    requests: int = 0


@dataclass
class LedgerState:
    """Everything a status remembers; the ledger derives used, reserved and summary from it."""

    admitted: dict[str, AdmittedRun] = field(default_factory=dict)
    reservations: dict[tuple[str, str], Reservation] = field(default_factory=dict)
    buckets: dict[dt.datetime, Tally] = field(default_factory=dict)
    lost: Lost = field(default_factory=Lost)
    refused: Refused = field(default_factory=Refused)
