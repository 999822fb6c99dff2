"""The price table: the operator's price file wins over the built-in prices for every model it matches."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest

from agentrun.api.usage import TokenUsage
from agentrun.model.pricing import PriceTable

MILLION_IN = TokenUsage(input_tokens=1_000_000)
SONNET = "claude-sonnet-4-6-20260217"


def price_file(tmp_path: Path, entries: str) -> PriceTable:
    """The table as the operator loads it from AGENTRUN_PRICE_FILE."""
    path = tmp_path / "prices.yaml"
    path.write_text(f"prices:\n{entries}")
    return PriceTable.load(path)


def input_price(table: PriceTable, model: str) -> Decimal | None:
    return table.cost(model, MILLION_IN)


def test_the_built_in_price_sets_the_baseline_these_tests_override() -> None:
    assert input_price(PriceTable(), SONNET) == Decimal(3)


def test_an_undated_override_beats_the_built_in_entry_for_the_same_pattern(tmp_path: Path) -> None:
    table = price_file(tmp_path, '  - {model: "claude-sonnet-4-6*", input: 2.5, output: 12}\n')
    assert input_price(table, SONNET) == Decimal("2.5")
    assert table.cost(SONNET, TokenUsage(output_tokens=1_000_000)) == Decimal(12)


def test_an_override_dated_before_the_built_in_entry_still_beats_it(tmp_path: Path) -> None:
    entry = '  - {model: "claude-sonnet-4-6*", effective: "2024-01-01", input: 2, output: 10}\n'
    assert input_price(price_file(tmp_path, entry), SONNET) == Decimal(2)


def test_an_override_for_the_exact_model_name_beats_the_built_in_pattern(tmp_path: Path) -> None:
    table = price_file(tmp_path, f'  - {{model: "{SONNET}", input: 1.5, output: 7.5}}\n')
    assert input_price(table, SONNET) == Decimal("1.5")


def test_a_broader_override_pattern_beats_a_more_specific_built_in_one(tmp_path: Path) -> None:
    table = price_file(tmp_path, '  - {model: "claude-*", input: 4, output: 20}\n')
    assert input_price(table, SONNET) == Decimal(4)
    assert input_price(table, "claude-haiku-4-5") == Decimal(4)


def test_between_two_override_entries_the_newest_in_effect_wins(tmp_path: Path) -> None:
    entries = (
        '  - {model: "claude-sonnet-4-6*", effective: "2025-01-01", input: 2, output: 10}\n'
        '  - {model: "claude-sonnet-4-6*", effective: "2026-03-01", input: 2.75, output: 11}\n'
        '  - {model: "claude-sonnet-4-6*", input: 9, output: 9}\n'
    )
    assert input_price(price_file(tmp_path, entries), SONNET) == Decimal("2.75")


def test_an_override_not_yet_in_effect_waits_and_the_current_one_applies(tmp_path: Path) -> None:
    entries = (
        '  - {model: "claude-sonnet-4-6*", effective: "2025-01-01", input: 2, output: 10}\n'
        '  - {model: "claude-sonnet-4-6*", effective: "2999-01-01", input: 7, output: 30}\n'
    )
    assert input_price(price_file(tmp_path, entries), SONNET) == Decimal(2)


def test_an_override_not_yet_in_effect_leaves_the_built_in_price_until_its_date(tmp_path: Path) -> None:
    entry = '  - {model: "claude-sonnet-4-6*", effective: "2999-01-01", input: 7, output: 30}\n'
    assert input_price(price_file(tmp_path, entry), SONNET) == Decimal(3)


def test_between_override_entries_a_more_specific_one_beats_a_newer_broader_one(tmp_path: Path) -> None:
    entries = (
        '  - {model: "claude-sonnet-4-6*", effective: "2025-01-01", input: 2, output: 10}\n'
        '  - {model: "claude-*", effective: "2026-06-01", input: 4, output: 20}\n'
    )
    table = price_file(tmp_path, entries)
    assert input_price(table, SONNET) == Decimal(2)
    assert input_price(table, "claude-opus-4-6") == Decimal(4)


def test_the_built_in_price_is_used_when_no_override_matches_the_model(tmp_path: Path) -> None:
    table = price_file(tmp_path, '  - {model: "my-proxy-model*", input: 3, output: 15}\n')
    assert input_price(table, "claude-haiku-4-5-20251001") == Decimal(1)
    assert input_price(table, "my-proxy-model-v2") == Decimal(3)
    assert input_price(table, "unknown-model") is None


def test_an_invalid_price_entry_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^invalid price entry .*'model': 'claude-\*'.*input"):
        price_file(tmp_path, '  - {model: "claude-*", output: 20}\n')


def test_a_providers_model_id_is_priced_as_its_claude_model_unless_an_entry_names_the_id_itself() -> None:
    regional = "eu.anthropic.claude-haiku-4-5-20251001-v1:0"
    table = PriceTable(today=dt.date(2026, 6, 1))
    assert table.knows(regional) and table.knows("claude-haiku-4-5@20251001")
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=0)
    assert table.cost(regional, usage) == Decimal("1")
    assert table.cost("claude-haiku-4-5@20251001", usage) == Decimal("1")
    premium = table.with_overrides([{"model": regional, "input": "1.10", "output": "5.50"}])
    assert premium.cost(regional, usage) == Decimal("1.10")
    assert premium.cost("global.anthropic.claude-haiku-4-5-20251001-v1:0", usage) == Decimal("1")
    assert not table.knows("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3")
