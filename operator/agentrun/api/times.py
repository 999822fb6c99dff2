"""Instants as the Kubernetes API stores them: RFC 3339 in UTC, to the second (Time) or microsecond
(MicroTime: a Lease's renewTime and acquireTime).

Why one module: run status, quota buckets, schedules, Agents, Events, Leases and TTLs all write and read
these strings, and a time written one way and read another (an offset dropped, a naive time read as
local) moves a deadline. Reading is lenient (any ISO 8601 offset, or none, taken as UTC; fractions of a
second kept); writing is one form per type.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["micro_rfc3339", "now_rfc3339", "parse_time", "rfc3339", "seconds_since", "unix_time"]


def _utc(instant: dt.datetime) -> dt.datetime:
    """The instant in UTC; a naive time is taken as UTC, never as the machine's local time."""
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=dt.UTC)
    return instant.astimezone(dt.UTC)


def rfc3339(instant: dt.datetime) -> str:
    """``2026-11-24T15:40:00Z``: the instant in UTC, to the second (a naive time is taken as UTC)."""
    return _utc(instant).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_rfc3339(instant: dt.datetime | None = None) -> str:
    """``2026-11-24T15:40:00.123456Z``, a MicroTime (now when ``instant`` is None; naive: UTC)."""
    return _utc(instant or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_rfc3339() -> str:
    return rfc3339(dt.datetime.now(dt.UTC))


def parse_time(raw: object) -> dt.datetime | None:
    """An RFC 3339 instant in UTC (a time without offset is taken as UTC), or None for anything else."""
    if not isinstance(raw, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(raw.strip())
    except ValueError:
        return None
    return _utc(parsed)


def unix_time(raw: object) -> float | None:
    """An RFC 3339 instant as Unix seconds (a time without offset is UTC), or None for anything else."""
    parsed = parse_time(raw)
    return parsed.timestamp() if parsed is not None else None


def seconds_since(raw: object, now: dt.datetime | None = None) -> float:
    """Seconds from an RFC 3339 instant to ``now``: 0 when it is absent, unreadable or in the future."""
    parsed = parse_time(raw)
    if parsed is None:
        return 0.0
    return max(0.0, (_utc(now or dt.datetime.now(dt.UTC)) - parsed).total_seconds())
