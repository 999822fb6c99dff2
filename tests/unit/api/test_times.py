"""Instants are written one way and read leniently, always as UTC."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from agentrun.api.times import micro_rfc3339, parse_time, rfc3339, seconds_since, unix_time


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


def test_a_micro_time_keeps_the_microseconds_in_utc_and_reads_back() -> None:
    berlin = dt.timezone(dt.timedelta(hours=1))
    instant = dt.datetime(2026, 11, 24, 16, 40, 5, 123_456, tzinfo=berlin)
    assert micro_rfc3339(instant) == "2026-11-24T15:40:05.123456Z"
    assert parse_time(micro_rfc3339(instant)) == instant
    assert micro_rfc3339(dt.datetime(2026, 11, 24, 15, 40, 5)) == "2026-11-24T15:40:05.000000Z"


def test_a_time_without_offset_is_utc_in_unix_seconds_whatever_the_machines_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert unix_time("2026-11-24T15:40:05") == unix_time("2026-11-24T15:40:05Z") == 1_795_534_805.0
    finally:
        monkeypatch.undo()
        time.tzset()
    assert unix_time("not a time") is None and unix_time(None) is None


def test_seconds_since_counts_to_now_and_never_below_zero() -> None:
    now = dt.datetime(2025, 6, 1, 12, 0, 30, tzinfo=dt.UTC)
    assert seconds_since("2025-06-01T12:00:00Z", now) == 30.0
    assert seconds_since("2025-06-01T14:00:00+02:00", now) == 30.0
    assert seconds_since(None, now) == 0.0
    assert seconds_since("not a time", now) == 0.0
    assert seconds_since("2025-06-01T12:01:00Z", now) == 0.0
