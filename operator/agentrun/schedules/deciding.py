"""The CronJob rules, as pure functions: which time is due, what the concurrency policy does with the
active runs, and which finished runs the history limits delete.

Missed times follow the CronJob controller: the unmet times are those after status.lastScheduleTime (or
the schedule's creation) up to now; only the most recent one is started, and only when it is not older
than startingDeadlineSeconds. More than TOO_MANY_MISSED unmet times (counted within the deadline, when
there is one) are reported: the operator was down long, or the schedule fires more often than it can.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from agentrun.schedules.cron import Cron

__all__ = [
    "TOO_MANY_MISSED",
    "Concurrency",
    "Due",
    "Replace",
    "RunRecord",
    "Skip",
    "Start",
    "admit",
    "due",
    "to_prune",
]

TOO_MANY_MISSED = 100


class Concurrency(StrEnum):
    ALLOW = "Allow"
    FORBID = "Forbid"
    REPLACE = "Replace"


@dataclass(frozen=True)
class Due:
    """What the schedule owes at ``now``."""

    start: dt.datetime | None  # the scheduled time of the run to create now
    late: dt.datetime | None  # the most recent unmet time, not started: older than the deadline
    missed: int  # unmet times (capped at TOO_MANY_MISSED + 1)
    next_time: dt.datetime | None  # the first time after now

    @property
    def too_many_missed(self) -> bool:
        return self.missed > TOO_MANY_MISSED

    @property
    def handled(self) -> dt.datetime | None:
        """The time status.lastScheduleTime moves to once this is acted on."""
        return self.start or self.late


def due(
    cron: Cron,
    tz: dt.tzinfo,
    *,
    since: dt.datetime,
    now: dt.datetime,
    deadline_seconds: int | None = None,
) -> Due:
    """The most recent unmet time in (since, now], whether it may still start, and the next time."""
    recent = cron.previous(now, tz)
    next_time = cron.next_after(now, tz)
    if recent is None or recent <= since:
        return Due(start=None, late=None, missed=0, next_time=next_time)
    earliest = since
    if deadline_seconds is not None:
        earliest = max(since, now - dt.timedelta(seconds=deadline_seconds))
    missed = sum(
        1
        for _ in itertools.islice(
            itertools.takewhile(lambda t: t <= now, cron.times(earliest, tz)), TOO_MANY_MISSED + 1
        )
    )
    if deadline_seconds is not None and recent + dt.timedelta(seconds=deadline_seconds) < now:
        return Due(start=None, late=recent, missed=max(missed, 1), next_time=next_time)
    return Due(start=recent, late=None, missed=max(missed, 1), next_time=next_time)


@dataclass(frozen=True)
class Start:
    """Create the run."""


@dataclass(frozen=True)
class Replace:
    """Cancel these active runs (spec.cancel), then create the run."""

    cancel: tuple[str, ...]


@dataclass(frozen=True)
class Skip:
    """Create nothing for this time: a run is still active and the policy is Forbid."""

    active: tuple[str, ...]


def admit(policy: Concurrency, active: Sequence[str]) -> Start | Replace | Skip:
    """What the concurrency policy makes of a due time, given the names of the unfinished runs."""
    if not active or policy is Concurrency.ALLOW:
        return Start()
    if policy is Concurrency.FORBID:
        return Skip(tuple(active))
    return Replace(tuple(active))


@dataclass(frozen=True)
class RunRecord:
    """What history pruning needs of one run of the schedule."""

    name: str
    uid: str
    scheduled: str  # the scheduled-time annotation (RFC 3339), or the creation time; sorts by time
    finished: bool
    succeeded: bool


def to_prune(runs: Sequence[RunRecord], *, successful: int, failed: int) -> list[RunRecord]:
    """Finished runs beyond the history limits, oldest first: the newest ``successful`` succeeded and
    the newest ``failed`` failed or cancelled runs are kept; unfinished runs always are."""
    doomed: list[RunRecord] = []
    for won, limit in ((True, successful), (False, failed)):
        kind = sorted(
            (r for r in runs if r.finished and r.succeeded is won), key=lambda r: (r.scheduled, r.name)
        )
        doomed += kind[: max(len(kind) - max(limit, 0), 0)]
    return sorted(doomed, key=lambda r: (r.scheduled, r.name))
