"""The names and tasks of scheduled runs."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrun.schedules.templates import TemplateError, render, run_name, unknown_placeholders

SCHEDULED = dt.datetime(2026, 11, 24, 12, 31, tzinfo=dt.UTC)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_a_run_is_named_after_its_schedule_and_the_unix_minute_of_its_time() -> None:
    assert run_name("nightly", SCHEDULED) == f"nightly-{int(SCHEDULED.timestamp()) // 60}"


def test_a_long_schedule_name_is_cut_to_42_characters() -> None:
    name = run_name("a" * 100, SCHEDULED)
    assert name.startswith("a" * 42 + "-") and len(name) == 42 + 1 + len(
        str(int(SCHEDULED.timestamp()) // 60)
    )


@given(st.from_regex(DNS_SUBDOMAIN, fullmatch=True).filter(lambda n: len(n) <= 253))
def test_every_schedule_name_gives_a_valid_run_name(schedule: str) -> None:
    name = run_name(schedule, SCHEDULED)
    assert DNS_SUBDOMAIN.match(name) and len(name) <= 63, name


def test_the_placeholders_are_filled_in() -> None:
    task = render(
        "Report for {{scheduledTime}} by {{ scheduleName }} in {{namespace}}.",
        scheduled=SCHEDULED,
        schedule="nightly",
        namespace="team-a",
    )
    assert task == "Report for 2026-11-24T12:31:00Z by nightly in team-a."


def test_an_unknown_placeholder_is_an_error_naming_it_and_the_known_ones() -> None:
    assert unknown_placeholders("{{ date }} and {{scheduledTime}}") == ["date"]
    with pytest.raises(TemplateError, match=r"\{\{date\}\}.*known: \{\{scheduledTime\}\}") as refused:
        render("{{date}}", scheduled=SCHEDULED, schedule="s", namespace="n")
    assert "\n" not in str(refused.value)


def test_text_without_placeholders_is_left_alone() -> None:
    assert render("plain { text }", scheduled=SCHEDULED, schedule="s", namespace="n") == "plain { text }"
