"""Instants as the Kubernetes API stores them: RFC 3339 in UTC, to the second.

Why one module: run status, quota buckets, schedules, Agents, Events and TTLs all write and read these
strings, and a time written one way and read another (an offset dropped, a naive time read as local)
moves a deadline. Reading is lenient (any ISO 8601 offset, or none, taken as UTC); writing is one form.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["now_rfc3339", "parse_time", "rfc3339"]


def rfc3339(instant: dt.datetime) -> str:
    """``2026-11-24T15:40:00Z``: the instant in UTC, to the second (a naive time is taken as UTC)."""
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=dt.UTC)
    return instant.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)
