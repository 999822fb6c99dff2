"""The windows a quota counts runs, tokens and dollars in, and the buckets that usage is kept in.

Rolling windows (Hour, Day) keep usage in fixed buckets aligned in UTC (1 minute for Hour, 15
minutes for Day) so the status stays small whatever the traffic. A bucket counts while its END is
within the window: every use in it happened before its end, so it expires late, never early, and
the limit is never passed by forgetting usage too soon. A Month window is the calendar month in UTC:
1-day buckets, all of which leave the window at the first instant of the next month.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum

from agentrun.quotas.formats import utc


class Window(StrEnum):
    HOUR = "Hour"
    DAY = "Day"
    MONTH = "Month"


#: Rolling windows: (length, bucket width).
_ROLLING: dict[Window, tuple[dt.timedelta, dt.timedelta]] = {
    Window.HOUR: (dt.timedelta(hours=1), dt.timedelta(minutes=1)),
    Window.DAY: (dt.timedelta(days=1), dt.timedelta(minutes=15)),
}
_DAY = dt.timedelta(days=1)


def describe(window: Window) -> str:
    """The window as messages name it."""
    return {
        Window.HOUR: "the rolling hour",
        Window.DAY: "the rolling day",
        Window.MONTH: "this calendar month (UTC)",
    }[window]


def month_start(at: dt.datetime) -> dt.datetime:
    return utc(at).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month_start(at: dt.datetime) -> dt.datetime:
    start = month_start(at)
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def bucket_width(window: Window) -> dt.timedelta:
    return _DAY if window is Window.MONTH else _ROLLING[window][1]


def bucket_start(window: Window, at: dt.datetime) -> dt.datetime:
    """The start of the bucket usage at ``at`` goes into."""
    at = utc(at)
    midnight = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if window is Window.MONTH:
        return midnight
    width = bucket_width(window)
    return midnight + ((at - midnight) // width) * width


def bucket_expiry(window: Window, start: dt.datetime) -> dt.datetime:
    """The first instant at which a bucket starting at ``start`` no longer counts."""
    if window is Window.MONTH:
        return next_month_start(start)
    length, width = _ROLLING[window]
    return utc(start) + width + length


def counts(window: Window, start: dt.datetime, now: dt.datetime) -> bool:
    return utc(now) < bucket_expiry(window, start)


def window_start(window: Window, now: dt.datetime) -> dt.datetime:
    """What status.windowStart says: the month's first instant, or ``now`` minus the window's length."""
    if window is Window.MONTH:
        return month_start(now)
    return utc(now) - _ROLLING[window][0]


def written_at(window: Window, recorded_start: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The earliest and the latest instant a status whose windowStart is ``recorded_start`` was written.

    Why: a previous process's totals (status.used) were true at that instant; a loader compares them
    with the buckets as they counted then (at the earliest: no bucket is thought gone that was not)
    and books what the buckets lost at the latest (so it expires late, never early).
    """
    if window is Window.MONTH:
        start = month_start(recorded_start)  # any instant of the month counts the same buckets
        return start, start
    # windowStart is written to the second: the write was within the second after start + length.
    earliest = utc(recorded_start) + _ROLLING[window][0]
    return earliest, earliest + dt.timedelta(seconds=1) - dt.timedelta(microseconds=1)
