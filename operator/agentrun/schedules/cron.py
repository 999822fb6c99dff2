"""Cron expressions (5 fields or a macro) evaluated in an IANA time zone.

Why our own parser: the rules are few (Vixie cron's fields, names, ranges, steps, the day-of-month /
day-of-week OR rule), and the one part libraries disagree on, daylight saving time, is then ours to state
and test: a schedule fires at every instant whose wall-clock time in its zone matches the fields. A
wall-clock time that does not exist (the hour skipped in spring) never fires; one that occurs twice (the
hour repeated in autumn) fires at both instants, as Kubernetes CronJobs do (robfig/cron).
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["Cron", "CronError", "zone"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: How far ahead (and back) a time is looked for: 28 years, the calendar's full cycle of weekdays and
#: leap days, so an expression that fires at all (Feb 29 on a Monday) fires within it.
HORIZON_DAYS = 366 * 28
_ITEM = re.compile(r"^(?P<range>\*|\?|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(?P<step>[0-9]+))?$")


class CronError(ValueError):
    """A one-line explanation of what is wrong with spec.schedule or spec.timeZone."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day of month", 1, 31, {}),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 7, _DAYS),
)


def _number(text: str, field: _Field) -> int:
    if text in field.names:
        return field.names[text]
    if not text.isdigit():
        raise CronError(f"{field.name} {text!r} is not a number")
    value = int(text)
    if not field.low <= value <= field.high:
        raise CronError(f"{field.name} {value} is outside {field.low}-{field.high}")
    return value


def _values(text: str, field: _Field) -> tuple[frozenset[int], bool]:
    """The values a field allows, and whether it is unrestricted (starts with * or ?)."""
    values: set[int] = set()
    for item in text.lower().split(","):
        match = _ITEM.match(item)
        if match is None:
            raise CronError(f"{field.name} {item!r} is not a number, range, list or step")
        span, step_text = match.group("range"), match.group("step")
        if span in ("*", "?"):
            low, high = field.low, field.high
        elif "-" in span:
            first, last = span.split("-", 1)
            low, high = _number(first, field), _number(last, field)
            if low > high:
                raise CronError(f"{field.name} range {span!r} runs backwards")
        else:
            low = _number(span, field)
            high = field.high if step_text is not None else low
        step = int(step_text) if step_text is not None else 1
        if step < 1:
            raise CronError(f"{field.name} step in {item!r} must be at least 1")
        values.update(range(low, high + 1, step))
    return frozenset(values), text.startswith(("*", "?"))


@dataclass(frozen=True)
class Cron:
    """A parsed schedule: the allowed values of each field."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day of month unrestricted
    any_weekday: bool  # day of week unrestricted

    @classmethod
    def parse(cls, expression: str) -> Cron:
        text = " ".join(expression.split())
        if text.upper().startswith(("TZ=", "CRON_TZ=")):
            raise CronError("a time zone in the schedule is not supported: use spec.timeZone")
        fields = MACROS.get(text.lower(), text).split(" ")
        if text.startswith("@") and text.lower() not in MACROS:
            raise CronError(f"unknown macro {text!r}; known: {', '.join(MACROS)}")
        if len(fields) != 5:
            raise CronError(
                f"{len(fields)} fields in {text!r}: a schedule has 5 (minute hour day-of-month month "
                "day-of-week) or is a macro such as @hourly"
            )
        parsed = [_values(f, spec) for f, spec in zip(fields, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in parsed[4][0])
        cron = cls(
            expression=text,
            minutes=tuple(sorted(parsed[0][0])),
            hours=tuple(sorted(parsed[1][0])),
            days=parsed[2][0],
            months=parsed[3][0],
            weekdays=weekdays,
            any_day=parsed[2][1],
            any_weekday=parsed[4][1],
        )
        if cron.any_weekday and not any(day <= _longest(month) for day in cron.days for month in cron.months):
            raise CronError(f"{text!r} never fires: none of its days of the month exist in its months")
        return cron

    def matches_day(self, day: dt.date) -> bool:
        """Cron's rule: with both day fields restricted, either one matching is enough."""
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def _instants(self, day: dt.date, tz: dt.tzinfo) -> list[dt.datetime]:
        """The instants (UTC) of one local day at which the schedule fires, in order."""
        if not self.matches_day(day):
            return []
        found: set[dt.datetime] = set()
        for hour in self.hours:
            for minute in self.minutes:
                wall = dt.datetime(day.year, day.month, day.day, hour, minute)
                for fold in (0, 1):
                    instant = wall.replace(tzinfo=tz, fold=fold).astimezone(dt.UTC)
                    # A wall time in the spring gap converts to another wall time: it does not exist.
                    if instant.astimezone(tz).replace(tzinfo=None) == wall:
                        found.add(instant)
        return sorted(found)

    def times(self, after: dt.datetime, tz: dt.tzinfo) -> Iterator[dt.datetime]:
        """Every firing instant strictly after ``after``, in order (UTC)."""
        day = after.astimezone(tz).date() - dt.timedelta(days=1)
        for _ in range(HORIZON_DAYS):
            for instant in self._instants(day, tz):
                if instant > after:
                    yield instant
            day += dt.timedelta(days=1)

    def next_after(self, after: dt.datetime, tz: dt.tzinfo) -> dt.datetime | None:
        return next(self.times(after, tz), None)

    def previous(self, at: dt.datetime, tz: dt.tzinfo) -> dt.datetime | None:
        """The latest firing instant not after ``at`` (UTC), or None within the horizon."""
        day = at.astimezone(tz).date() + dt.timedelta(days=1)
        for _ in range(HORIZON_DAYS):
            for instant in reversed(self._instants(day, tz)):
                if instant <= at:
                    return instant
            day -= dt.timedelta(days=1)
        return None


def _longest(month: int) -> int:
    return 29 if month == 2 else calendar.monthrange(2001, month)[1]


def zone(name: str) -> ZoneInfo:
    """The IANA zone of spec.timeZone; CronError for a name the zone database does not know."""
    if not name or name.startswith(("/", ".")) or ".." in name:
        raise CronError(f"time zone {name!r} is not an IANA zone name such as Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin or UTC"
        ) from None
