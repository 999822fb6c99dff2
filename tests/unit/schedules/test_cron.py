"""Cron expressions in a time zone: parsing, next and previous times, daylight saving time."""

from __future__ import annotations

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.schedules.cron import Cron, CronError, zone

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def upcoming(expression: str, after: str, tz: dt.tzinfo, count: int) -> list[str]:
    times = Cron.parse(expression).times(at(after), tz)
    return [next(times).astimezone(tz).isoformat() for _ in range(count)]


def test_every_minute_fires_at_the_next_whole_minute() -> None:
    assert Cron.parse("* * * * *").next_after(at("2026-11-24T12:30:15+00:00"), UTC) == at(
        "2026-11-24T12:31:00+00:00"
    )


def test_a_time_exactly_on_the_schedule_is_not_after_itself() -> None:
    cron = Cron.parse("*/15 * * * *")
    assert cron.next_after(at("2026-01-01T00:15:00+00:00"), UTC) == at("2026-01-01T00:30:00+00:00")
    assert cron.previous(at("2026-01-01T00:15:00+00:00"), UTC) == at("2026-01-01T00:15:00+00:00")


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("@hourly", "2026-03-01T10:20:00+00:00", "2026-03-01T11:00:00+00:00"),
        ("@daily", "2026-03-01T10:20:00+00:00", "2026-03-02T00:00:00+00:00"),
        ("@weekly", "2026-03-02T10:20:00+00:00", "2026-03-08T00:00:00+00:00"),  # a Sunday
        ("@monthly", "2026-03-02T10:20:00+00:00", "2026-04-01T00:00:00+00:00"),
        ("@yearly", "2026-03-02T10:20:00+00:00", "2027-01-01T00:00:00+00:00"),
        ("30 9 * * mon-fri", "2026-03-06T10:00:00+00:00", "2026-03-09T09:30:00+00:00"),  # Fri → Mon
        ("0 0 29 feb *", "2026-03-01T00:00:00+00:00", "2028-02-29T00:00:00+00:00"),
        ("0 12 1-7 * sun", "2026-03-02T00:00:00+00:00", "2026-03-02T12:00:00+00:00"),  # dom
        ("0 12 1-7 * sun", "2026-03-07T13:00:00+00:00", "2026-03-08T12:00:00+00:00"),  # OR dow
        ("5/20 */6 * JAN,dec 7", "2026-03-02T00:00:00+00:00", "2026-12-06T00:05:00+00:00"),
    ],
)
def test_fields_names_ranges_steps_and_macros(expression: str, after: str, expected: str) -> None:
    assert Cron.parse(expression).next_after(at(after), UTC) == at(expected)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "4 fields"),
        ("* * * * * *", "6 fields"),
        ("60 * * * *", "minute 60 is outside 0-59"),
        ("* 24 * * *", "hour 24 is outside 0-23"),
        ("* * 0 * *", "day of month 0 is outside 1-31"),
        ("* * * 13 *", "month 13 is outside 1-12"),
        ("* * * * 8", "day of week 8 is outside 0-7"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "at least 1"),
        ("x * * * *", "not a number"),
        ("@fortnightly", "unknown macro"),
        ("0 0 30 2 *", "never fires"),
        ("TZ=UTC * * * * *", "use spec.timeZone"),
    ],
)
def test_a_bad_expression_is_refused_with_one_line_saying_what(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=message) as refused:
        Cron.parse(expression)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "/etc/localtime"])
def test_an_unknown_time_zone_is_refused(name: str) -> None:
    with pytest.raises(CronError, match="time zone"):
        zone(name)


def test_a_known_time_zone_is_found() -> None:
    assert zone("Europe/Berlin") == BERLIN


def test_the_schedule_is_read_in_its_time_zone() -> None:
    # 09:00 in Berlin in winter is 08:00 UTC.
    assert Cron.parse("0 9 * * *").next_after(at("2026-01-10T00:00:00+00:00"), BERLIN) == at(
        "2026-01-10T08:00:00+00:00"
    )


def test_a_wall_time_skipped_in_spring_never_fires() -> None:
    # Berlin, 2026-03-29: 02:00 jumps to 03:00. 02:30 does not exist that day.
    assert upcoming("30 2 * * *", "2026-03-28T12:00:00+01:00", BERLIN, 2) == [
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    # Hourly: 01:00, then 03:00 (CEST); nothing at the missing hour.
    assert upcoming("0 * * * *", "2026-03-29T00:30:00+01:00", BERLIN, 3) == [
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T04:00:00+02:00",
    ]


def test_a_wall_time_repeated_in_autumn_fires_at_both_instants() -> None:
    # New York, 2026-11-01: 01:00-02:00 happens twice (EDT, then EST).
    assert upcoming("30 1 * * *", "2026-11-01T00:00:00-04:00", NEW_YORK, 3) == [
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:30:00-05:00",
        "2026-11-02T01:30:00-05:00",
    ]


def test_every_minute_stays_every_minute_across_the_autumn_change() -> None:
    times = Cron.parse("* * * * *").times(at("2026-10-25T00:58:00+00:00"), BERLIN)
    first = [next(times) for _ in range(5)]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(first)] == [60.0] * 4


EXPRESSIONS = st.sampled_from(
    [
        "* * * * *",
        "*/7 * * * *",
        "0 * * * *",
        "30 2 * * *",
        "15 1,2,3 * * *",
        "0 0 * * 0",
        "45 23 31 * *",
        "0 9-17/2 * * mon-fri",
        "0 12 13 * 5",
    ]
)
ZONES = st.sampled_from([UTC, BERLIN, NEW_YORK, ZoneInfo("Australia/Lord_Howe"), ZoneInfo("Asia/Kolkata")])
INSTANTS = st.datetimes(
    min_value=dt.datetime(2024, 1, 1), max_value=dt.datetime(2030, 12, 31), timezones=st.just(UTC)
)


def _fires(cron: Cron, instant: dt.datetime, tz: dt.tzinfo) -> bool:
    local = instant.astimezone(tz)
    return local.minute in cron.minutes and local.hour in cron.hours and cron.matches_day(local.date())


@settings(max_examples=60, deadline=None)
@given(EXPRESSIONS, ZONES, INSTANTS)
def test_next_is_the_first_whole_minute_whose_local_time_matches(
    expression: str, tz: dt.tzinfo, after: dt.datetime
) -> None:
    cron = Cron.parse(expression)
    found = cron.next_after(after, tz)
    assert found is not None and found > after and _fires(cron, found, tz)
    minute = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    # No earlier minute fires (checked up to a day back from the answer: enough for these expressions).
    start = max(minute, found - dt.timedelta(days=8))
    probe = start
    while probe < found:
        assert not _fires(cron, probe, tz), probe
        probe += dt.timedelta(minutes=1)


@settings(max_examples=60, deadline=None)
@given(EXPRESSIONS, ZONES, INSTANTS)
def test_previous_is_the_latest_time_with_none_between_it_and_now(
    expression: str, tz: dt.tzinfo, instant: dt.datetime
) -> None:
    cron = Cron.parse(expression)
    before = cron.previous(instant, tz)
    assert before is not None and before <= instant and _fires(cron, before, tz)
    after = cron.next_after(before, tz)
    assert after is not None and after > instant
