"""agentrun.json_text writes and reads what the json module does, faster: the values where its fast
libraries would differ (big integers, keys that are not strings, types they know and json does not)
must come out as json's."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrun import json_text

# JSON's own values without floats: their text must be json's byte for byte.
EXACT = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=30,
)
FINITE = st.floats(allow_nan=False, allow_infinity=False)


def _json(value: Any, **kwargs: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, **kwargs).encode()


@given(EXACT)
def test_json_values_are_written_as_the_json_module_writes_them_compactly(value: Any) -> None:
    assert json_text.encode(value) == _json(value)


@given(st.lists(FINITE, max_size=5))
def test_a_float_reads_back_as_the_same_number(values: list[float]) -> None:
    assert json_text.decode(json_text.encode(values)) == values
    assert json.loads(json_text.encode(values)) == values


@pytest.mark.parametrize(
    "value",
    [
        {"n": 2**70, "m": -(2**80)},  # past 64 bits
        {1: "a", None: "b", False: "c", 2.5: "d"},  # keys that are not strings
    ],
    ids=["integers past 64 bits", "keys that are not strings"],
)
def test_what_the_fast_encoder_refuses_is_written_as_json_writes_it(value: Any) -> None:
    assert json_text.encode(value) == _json(value)


def test_nesting_past_the_fast_encoders_limit_is_written_as_json_writes_it() -> None:
    value: Any = "deep"
    for _ in range(400):
        value = {"a": [value]}
    assert json_text.encode(value) == _json(value)


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize(
    "value",
    [Point(1), datetime.datetime(2026, 11, 29, 15, 53, tzinfo=datetime.UTC), {1, 2}, b"bytes"],
    ids=["dataclass", "datetime", "set", "bytes"],
)
def test_other_types_go_to_default_as_with_json(value: Any) -> None:
    assert json_text.encode({"v": value}, default=str) == _json({"v": value}, default=str)
    with pytest.raises(TypeError):
        json_text.encode({"v": value})


def test_integers_past_64_bits_are_read_exactly() -> None:
    big = 123456789012345678901234567890
    assert json_text.decode(b'{"a": %d}' % big) == {"a": big}
    assert json_text.decode(b'{"a": %d}' % -big) == {"a": -big}


def test_nan_and_infinity_are_read_as_the_json_module_reads_them() -> None:
    value = json_text.decode(b"[NaN, Infinity, -Infinity]")
    assert math.isnan(value[0]) and value[1:] == [math.inf, -math.inf]


def test_a_repeated_key_keeps_its_last_value_as_with_json() -> None:
    assert json_text.decode(b'{"a": 1, "a": 2}') == json.loads('{"a": 1, "a": 2}') == {"a": 2}


@pytest.mark.parametrize("data", [b'{"a":', b"", b"not json", b'{"a": 1} trailing', b'"\xff"'])
def test_what_is_not_json_raises_the_json_modules_error(data: bytes) -> None:
    with pytest.raises(json.JSONDecodeError):
        json_text.decode(data)


@given(EXACT)
def test_what_is_written_reads_back_the_same(value: Any) -> None:
    assert json_text.decode(json_text.encode(value)) == json.loads(_json(value))


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_without_allow_nan_a_nan_or_infinity_is_refused_as_json_refuses_it(number: float) -> None:
    with pytest.raises(ValueError, match="Out of range float values"):
        json_text.encode({"temperature": number}, allow_nan=False)


@given(EXACT)
def test_without_allow_nan_a_text_holding_null_is_still_jsons(value: Any) -> None:
    value = {"content": "null", "v": value, "none": None}
    assert json_text.encode(value, allow_nan=False) == _json(value, allow_nan=False)
