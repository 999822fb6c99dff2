"""The CronJob rules with a fake `now`: missed times, the starting deadline, concurrency, history."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun.schedules.cron import Cron
from agentrun.schedules.deciding import (
    TOO_MANY_MISSED,
    Concurrency,
    Replace,
    RunRecord,
    Skip,
    Start,
    admit,
    due,
    to_prune,
)

UTC = dt.UTC
EVERY_MINUTE = Cron.parse("* * * * *")
HOURLY = Cron.parse("0 * * * *")


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def test_nothing_is_due_before_the_first_time() -> None:
    owed = due(HOURLY, UTC, since=at("2026-11-24T12:10:00+00:00"), now=at("2026-11-24T12:59:59+00:00"))
    assert (owed.start, owed.late, owed.missed) == (None, None, 0)
    assert owed.next_time == at("2026-11-24T13:00:00+00:00")


def test_the_time_just_passed_is_due() -> None:
    owed = due(HOURLY, UTC, since=at("2026-11-24T12:10:00+00:00"), now=at("2026-11-24T13:00:01+00:00"))
    assert owed.start == at("2026-11-24T13:00:00+00:00") and owed.missed == 1
    assert owed.next_time == at("2026-11-24T14:00:00+00:00")


def test_a_time_already_handled_is_not_due_again() -> None:
    handled = at("2026-11-24T13:00:00+00:00")
    assert due(HOURLY, UTC, since=handled, now=at("2026-11-24T13:30:00+00:00")).start is None


def test_after_an_outage_only_the_most_recent_missed_time_is_started() -> None:
    owed = due(HOURLY, UTC, since=at("2026-11-24T08:00:00+00:00"), now=at("2026-11-24T13:20:00+00:00"))
    assert owed.start == at("2026-11-24T13:00:00+00:00")
    assert owed.missed == 5 and not owed.too_many_missed


def test_a_missed_time_older_than_the_starting_deadline_is_not_started() -> None:
    owed = due(
        HOURLY,
        UTC,
        since=at("2026-11-24T08:00:00+00:00"),
        now=at("2026-11-24T13:20:00+00:00"),
        deadline_seconds=600,
    )
    assert owed.start is None and owed.late == at("2026-11-24T13:00:00+00:00")
    assert owed.handled == owed.late


def test_a_missed_time_within_the_starting_deadline_is_started() -> None:
    owed = due(
        HOURLY,
        UTC,
        since=at("2026-11-24T08:00:00+00:00"),
        now=at("2026-11-24T13:09:00+00:00"),
        deadline_seconds=600,
    )
    assert owed.start == at("2026-11-24T13:00:00+00:00") and owed.late is None


def test_more_than_a_hundred_missed_times_are_reported() -> None:
    owed = due(EVERY_MINUTE, UTC, since=at("2026-11-24T08:00:00+00:00"), now=at("2026-11-24T13:20:30+00:00"))
    assert owed.too_many_missed and owed.start == at("2026-11-24T13:20:00+00:00")
    assert owed.missed == TOO_MANY_MISSED + 1


def test_the_deadline_bounds_the_missed_count_as_for_a_cronjob() -> None:
    owed = due(
        EVERY_MINUTE,
        UTC,
        since=at("2026-11-24T08:00:00+00:00"),
        now=at("2026-11-24T13:20:30+00:00"),
        deadline_seconds=300,
    )
    assert not owed.too_many_missed and owed.missed == 5


@settings(max_examples=80, deadline=None)
@given(
    since=st.datetimes(
        min_value=dt.datetime(2026, 1, 1), max_value=dt.datetime(2026, 2, 1), timezones=st.just(UTC)
    ),
    gap=st.integers(min_value=0, max_value=10_000),
    deadline=st.one_of(st.none(), st.integers(min_value=1, max_value=7200)),
)
def test_whatever_the_outage_at_most_one_run_is_owed_and_it_is_the_latest_time(
    since: dt.datetime, gap: int, deadline: int | None
) -> None:
    now = since + dt.timedelta(minutes=gap, seconds=7)
    owed = due(HOURLY, UTC, since=since, now=now, deadline_seconds=deadline)
    latest = HOURLY.previous(now, UTC)
    assert latest is not None
    if latest <= since:
        assert owed.handled is None and owed.missed == 0
        return
    assert owed.handled == latest
    within = deadline is None or latest + dt.timedelta(seconds=deadline) >= now
    assert (owed.start is not None) == within
    # Handled, the same moment owes nothing more: a restart right after creates no second run.
    assert due(HOURLY, UTC, since=latest, now=now, deadline_seconds=deadline).handled is None


def test_allow_starts_whatever_is_active() -> None:
    assert admit(Concurrency.ALLOW, ["a"]) == Start()


def test_forbid_skips_while_a_run_is_active_and_starts_otherwise() -> None:
    assert admit(Concurrency.FORBID, ["a"]) == Skip(("a",))
    assert admit(Concurrency.FORBID, []) == Start()


def test_replace_cancels_the_active_runs_then_starts() -> None:
    assert admit(Concurrency.REPLACE, ["a", "b"]) == Replace(("a", "b"))
    assert admit(Concurrency.REPLACE, []) == Start()


def record(name: str, minute: int, phase: str | None) -> RunRecord:
    return RunRecord(
        name=name,
        uid=f"uid-{name}",
        scheduled=f"2026-11-24T12:{minute:02d}:00Z",
        finished=phase in ("Succeeded", "Failed", "Cancelled"),
        succeeded=phase == "Succeeded",
    )


def test_history_keeps_the_newest_finished_runs_of_each_kind() -> None:
    runs = [
        record("s1", 1, "Succeeded"),
        record("f1", 2, "Failed"),
        record("s2", 3, "Succeeded"),
        record("c1", 4, "Cancelled"),
        record("s3", 5, "Succeeded"),
        record("r1", 6, None),
        record("r0", 0, "Running"),
    ]
    assert [r.name for r in to_prune(runs, successful=2, failed=1)] == ["s1", "f1"]
    assert [r.name for r in to_prune(runs, successful=0, failed=0)] == ["s1", "f1", "s2", "c1", "s3"]
    assert to_prune(runs, successful=3, failed=2) == []


@settings(max_examples=100, deadline=None)
@given(
    phases=st.lists(st.sampled_from(["Succeeded", "Failed", "Cancelled", "Running", None]), max_size=20),
    successful=st.integers(min_value=0, max_value=5),
    failed=st.integers(min_value=0, max_value=5),
)
def test_history_pruning_never_touches_unfinished_runs_and_leaves_the_limits(
    phases: list[str | None], successful: int, failed: int
) -> None:
    runs = [record(f"r{i}", i, phase) for i, phase in enumerate(phases)]
    doomed = {r.name for r in to_prune(runs, successful=successful, failed=failed)}
    kept = [r for r in runs if r.name not in doomed]
    assert all(r.finished for r in runs if r.name in doomed)
    won = [r for r in runs if r.finished and r.succeeded]
    lost = [r for r in runs if r.finished and not r.succeeded]
    assert sum(r.succeeded for r in kept) == min(len(won), successful)
    assert sum(r.finished and not r.succeeded for r in kept) == min(len(lost), failed)
    # The ones kept are the newest.
    for group, limit in ((won, successful), (lost, failed)):
        newest = {r.name for r in group[max(len(group) - limit, 0) :]}
        assert {r.name for r in group} - doomed == newest
