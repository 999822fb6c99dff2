"""Windows and buckets: what counts when, aligned in UTC, rolling over at bucket and month edges."""

from __future__ import annotations

import datetime as dt

import pytest

from agentrun.quotas.windows import (
    Window,
    bucket_expiry,
    bucket_start,
    counts,
    next_month_start,
    window_start,
)
from tests.unit.quotas.quota_objects import at


@pytest.mark.parametrize(
    ("window", "instant", "start"),
    [
        (Window.HOUR, "2026-11-24T09:14:59.999999Z", "2026-11-24T09:14:00Z"),
        (Window.HOUR, "2026-11-24T09:15:00Z", "2026-11-24T09:15:00Z"),
        (Window.DAY, "2026-11-24T09:14:59Z", "2026-11-24T09:00:00Z"),
        (Window.DAY, "2026-11-24T09:15:00Z", "2026-11-24T09:15:00Z"),
        (Window.DAY, "2026-11-24T23:59:59Z", "2026-11-24T23:45:00Z"),
        (Window.MONTH, "2026-12-31T23:59:59Z", "2026-12-31T00:00:00Z"),
        (Window.MONTH, "2027-01-01T00:00:00Z", "2027-01-01T00:00:00Z"),
    ],
)
def test_usage_goes_into_the_bucket_aligned_in_utc_that_holds_its_instant(
    window: Window, instant: str, start: str
) -> None:
    assert bucket_start(window, at(instant)) == at(start)


def test_a_bucket_is_aligned_in_utc_whatever_offset_the_time_carries() -> None:
    in_kolkata = dt.datetime(2026, 11, 24, 14, 50, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))
    assert bucket_start(Window.DAY, in_kolkata) == at("2026-11-24T09:15:00Z")


def test_a_naive_time_is_refused_rather_than_shifting_every_bucket_by_the_local_offset() -> None:
    with pytest.raises(ValueError, match="aware time"):
        bucket_start(Window.HOUR, dt.datetime(2026, 11, 24, 9, 0))


def test_an_hour_bucket_counts_until_its_end_has_left_the_rolling_hour() -> None:
    start = at("2026-11-24T09:14:00Z")  # ends 09:15:00: counts while 09:15 is within the last hour
    assert counts(Window.HOUR, start, at("2026-11-24T10:14:59.999999Z"))
    assert not counts(Window.HOUR, start, at("2026-11-24T10:15:00Z"))
    assert bucket_expiry(Window.HOUR, start) == at("2026-11-24T10:15:00Z")


def test_a_day_bucket_counts_until_its_end_has_left_the_rolling_day() -> None:
    start = at("2026-11-24T09:00:00Z")
    assert counts(Window.DAY, start, at("2026-11-25T09:14:59Z"))
    assert not counts(Window.DAY, start, at("2026-11-25T09:15:00Z"))


def test_usage_at_the_very_start_of_a_bucket_expires_late_never_early() -> None:
    spent = at("2026-11-24T09:00:00Z")
    expiry = bucket_expiry(Window.DAY, bucket_start(Window.DAY, spent))
    assert expiry >= spent + dt.timedelta(days=1)


def test_a_month_bucket_counts_until_the_first_instant_of_the_next_month_december_to_january() -> None:
    start = bucket_start(Window.MONTH, at("2026-12-31T23:59:59Z"))
    assert counts(Window.MONTH, start, at("2026-12-31T23:59:59.999999Z"))
    assert not counts(Window.MONTH, start, at("2027-01-01T00:00:00Z"))
    assert bucket_expiry(Window.MONTH, at("2026-12-01T00:00:00Z")) == at("2027-01-01T00:00:00Z")


def test_the_next_month_of_december_is_january_of_the_next_year() -> None:
    assert next_month_start(at("2026-12-15T10:00:00Z")) == at("2027-01-01T00:00:00Z")
    assert next_month_start(at("2026-02-28T10:00:00Z")) == at("2026-03-01T00:00:00Z")


@pytest.mark.parametrize(
    ("window", "now", "start"),
    [
        (Window.HOUR, "2026-11-24T09:30:00Z", "2026-11-24T08:30:00Z"),
        (Window.DAY, "2026-11-24T09:30:00Z", "2026-11-23T09:30:00Z"),
        (Window.MONTH, "2026-11-24T09:30:00Z", "2026-11-01T00:00:00Z"),
    ],
)
def test_the_window_starts_a_window_length_ago_or_at_the_month_start(
    window: Window, now: str, start: str
) -> None:
    assert window_start(window, at(now)) == at(start)
