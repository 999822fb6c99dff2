"""Instants are written one way and read leniently, always as UTC."""

from __future__ import annotations

import datetime as dt

import pytest

from agentrun.api.times import parse_time, rfc3339


def test_an_instant_is_written_in_utc_to_the_second() -> None:
    berlin = dt.timezone(dt.timedelta(hours=1))
    assert rfc3339(dt.datetime(2026, 11, 24, 16, 40, 5, 999_999, tzinfo=berlin)) == "2026-11-24T15:40:05Z"
    assert rfc3339(dt.datetime(2026, 11, 24, 15, 40, 5)) == "2026-11-24T15:40:05Z"  # naive: taken as UTC


@pytest.mark.parametrize(
    "raw",
    ["2026-11-24T15:40:05Z", "2026-11-24T16:40:05+01:00", "2026-11-24T15:40:05", " 2026-11-24T15:40:05Z\n"],
)
def test_any_offset_or_none_reads_as_the_same_utc_instant(raw: str) -> None:
    parsed = parse_time(raw)
    assert parsed == dt.datetime(2026, 11, 24, 15, 40, 5, tzinfo=dt.UTC)
    assert parsed is not None and parsed.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize("raw", [None, "", "yesterday", 1764000000, "2026-13-01T00:00:00Z"])
def test_what_is_not_an_instant_reads_as_none(raw: object) -> None:
    assert parse_time(raw) is None


def test_what_is_written_reads_back_unchanged() -> None:
    instant = dt.datetime(2026, 2, 28, 23, 59, 59, tzinfo=dt.UTC)
    assert parse_time(rfc3339(instant)) == instant
