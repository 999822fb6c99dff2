"""Kubernetes quantities: read exactly by every suffix, refused clearly, written back to the same amount."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrun.api.sandbox_spec import QUANTITY_PATTERN
from agentrun.quotas.quantities import QuantityError, cpu_text, memory_text, parse_quantity


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("2", "2"),
        ("+2", "2"),
        ("0", "0"),
        ("500m", "0.5"),
        ("1500m", "1.5"),
        ("250u", "0.00025"),
        ("7n", "0.000000007"),
        ("1.5", "1.5"),
        (".5", "0.5"),
        ("1.", "1"),
        ("2k", "2000"),
        ("3M", "3000000"),
        ("1G", "1000000000"),
        ("1T", "1000000000000"),
        ("1P", "1000000000000000"),
        ("1E", "1000000000000000000"),
        ("1Ki", "1024"),
        ("512Mi", "536870912"),
        ("1.5Gi", "1610612736"),
        ("1Ti", "1099511627776"),
        ("1Pi", "1125899906842624"),
        ("1Ei", "1152921504606846976"),
        ("2e3", "2000"),
        ("2E3", "2000"),
        ("1.5e+2", "150"),
        ("25e-3", "0.025"),
    ],
)
def test_every_suffix_and_exponent_is_read_to_its_exact_amount(text: str, amount: str) -> None:
    assert parse_quantity(text) == Decimal(amount)


def test_amounts_add_up_exactly_where_floats_would_not() -> None:
    # 0.1 + 0.2 cores as floats is 0.30000000000000004: a third sandbox of 100m would not fit in 300m.
    total = parse_quantity("100m") + parse_quantity("0.2")
    assert total == parse_quantity("300m")
    assert parse_quantity("0.1Gi") * 10 == parse_quantity("1Gi")


@pytest.mark.parametrize(
    "text", ["1.2.3", "5mk", "-1", "1e", "1e100", "Mi", "", " 1", "1 Gi", "1gi", "1KI", "0x10"]
)
def test_a_value_outside_the_crds_quantity_grammar_is_refused_naming_it(text: str) -> None:
    with pytest.raises(QuantityError, match=re.escape(repr(text)) + " is not a Kubernetes quantity"):
        parse_quantity(text)


def test_a_number_that_is_not_a_string_is_refused_saying_how_to_write_it() -> None:
    with pytest.raises(
        QuantityError, match=r"2 is not a Kubernetes quantity \(a string such as 500m or 1Gi\)"
    ):
        parse_quantity(2)


@pytest.mark.parametrize(
    ("text", "written"),
    [("2", "2"), ("1500m", "1500m"), ("0.5", "500m"), ("250u", "0.00025"), ("0", "0"), ("2k", "2000")],
)
def test_cpu_is_written_in_whole_cores_or_millicores_when_exact(text: str, written: str) -> None:
    assert cpu_text(parse_quantity(text)) == written


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("536870912", "512Mi"),
        ("1G", "1G"),
        ("1E", "1E"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("1500", "1500"),
        ("2000", "2k"),
        ("0", "0"),
        ("1500m", "1.5"),
    ],
)
def test_memory_is_written_in_its_shortest_exact_form(text: str, written: str) -> None:
    assert memory_text(parse_quantity(text)) == written


@given(st.from_regex(QUANTITY_PATTERN, fullmatch=True).filter(lambda text: len(text) <= 64))
def test_every_value_the_crd_admits_is_counted_and_written_back_to_the_same_amount(text: str) -> None:
    amount = parse_quantity(text)
    assert amount >= 0
    assert parse_quantity(cpu_text(amount)) == amount
    assert parse_quantity(memory_text(amount)) == amount
