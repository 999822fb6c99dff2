"""The operator collects the youngest generation less often while it runs, and puts the pace back."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pydantic
import pytest

from agentrun.controller.collector import young_generation_threshold
from agentrun.settings import Settings, describe_settings_error


@pytest.fixture(autouse=True)
def thresholds_kept() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_the_youngest_generation_is_collected_less_often_inside_and_as_before_after(
    thresholds_kept: tuple[int, int, int],
) -> None:
    with young_generation_threshold(50_000):
        assert gc.get_threshold() == (50_000, *thresholds_kept[1:])
        assert gc.isenabled()
    assert gc.get_threshold() == thresholds_kept


def _collected(obj: object) -> bool:
    """Whether ``obj`` is in a generation the collector walks (not frozen)."""
    return any(obj is tracked for generation in (0, 1, 2) for tracked in gc.get_objects(generation))


def test_what_exists_on_the_way_in_is_frozen_out_of_collections_and_thawed_after() -> None:
    assert gc.get_freeze_count() == 0
    held = {"alive on the way in": [1, 2]}
    with young_generation_threshold(50_000):
        assert gc.get_freeze_count() > 0
        assert not _collected(held)
        made_inside = {"new": [3]}
        assert _collected(made_inside)
    assert gc.get_freeze_count() == 0
    assert _collected(held)


def test_the_pace_is_put_back_when_the_operator_fails(thresholds_kept: tuple[int, int, int]) -> None:
    with pytest.raises(RuntimeError), young_generation_threshold(10_000):
        raise RuntimeError("the API server is gone")
    assert gc.get_threshold() == thresholds_kept
    assert gc.get_freeze_count() == 0


def test_the_threshold_is_a_setting_of_its_own_with_a_bound() -> None:
    assert Settings().gc_young_threshold == 50_000
    assert Settings.from_env({"AGENTRUN_GC_YOUNG_THRESHOLD": "700"}).gc_young_threshold == 700
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings.from_env({"AGENTRUN_GC_YOUNG_THRESHOLD": "0"})
    assert describe_settings_error(caught.value) == (
        "AGENTRUN_GC_YOUNG_THRESHOLD: Input should be greater than or equal to 100"
    )
