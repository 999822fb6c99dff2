"""Prices per model, with effective dates, overridable by the operator's configuration.

Usage of a model missing from the table is reported as unpriced; its cost is never guessed.
Prices are USD per million tokens. Cache writes are billed at the 5-minute TTL rate.

The operator's own entries (`AGENTRUN_PRICE_FILE`) win over the built-in table for every model
they match, whatever their dates: an operator who writes down a price (a negotiated rate, a proxy's
markup) means it, and an undated entry must not lose to a built-in one by defaulting to 1970.
Within each source the choice is by specificity, then date (see `PriceTable.lookup`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from agentrun.api.model_names import claude_model
from agentrun.api.usage import TokenUsage

MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Price:
    model: str  # exact name or a prefix ending in "*"
    effective: dt.date
    input: Decimal
    output: Decimal
    cache_write: Decimal
    cache_read: Decimal

    def matches(self, model: str) -> bool:
        if self.model.endswith("*"):
            return model.startswith(self.model[:-1])
        return model == self.model

    def cost(self, usage: TokenUsage) -> Decimal:
        return (
            self.input * usage.input_tokens
            + self.output * usage.output_tokens
            + self.cache_write * usage.cache_creation_input_tokens
            + self.cache_read * usage.cache_read_input_tokens
        ) / MILLION


def _price(model: str, effective: str, inp: str, out: str) -> Price:
    i, o = Decimal(inp), Decimal(out)
    # Anthropic bills 5-minute cache writes at 1.25x and cache reads at 0.1x the input price.
    return Price(model, dt.date.fromisoformat(effective), i, o, i * Decimal("1.25"), i * Decimal("0.1"))


DEFAULT_PRICES: tuple[Price, ...] = (
    _price("claude-opus-4-6*", "2026-02-05", "5", "25"),
    _price("claude-sonnet-4-6*", "2026-02-17", "3", "15"),
    _price("claude-opus-4-5*", "2025-11-24", "5", "25"),
    _price("claude-opus-4-1*", "2025-08-05", "15", "75"),
    _price("claude-opus-4*", "2025-05-22", "15", "75"),
    _price("claude-sonnet-4-5*", "2025-09-29", "3", "15"),
    _price("claude-sonnet-4*", "2025-05-22", "3", "15"),
    _price("claude-haiku-4-5*", "2025-10-15", "1", "5"),
    _price("claude-3-7-sonnet*", "2025-02-24", "3", "15"),
    _price("claude-3-5-haiku*", "2024-10-22", "0.80", "4"),
)


class PriceTable:
    """Picks, for a model, the most specific entry already in effect on the pricing date.

    Overrides are searched first; the built-in prices only price models no override matches.
    """

    def __init__(
        self,
        prices: Iterable[Price] = DEFAULT_PRICES,
        *,
        overrides: Iterable[Price] = (),
        today: dt.date | None = None,
    ) -> None:
        self._prices = tuple(prices)
        self._overrides = tuple(overrides)
        self._today = today
        # Every run prices its usage before each request; the table never changes, the date rarely.
        self._found: dict[tuple[str, dt.date], Price | None] = {}

    def lookup(self, model: str) -> Price | None:
        today = self._today or dt.date.today()
        key = (model, today)
        if key not in self._found:
            if len(self._found) > 1024:
                self._found.clear()
            self._found[key] = self._search(model, today)
        return self._found[key]

    def _search(self, model: str, today: dt.date) -> Price | None:
        for source in (self._overrides, self._prices):
            for name in _names(model):
                candidates = [p for p in source if p.matches(name) and p.effective <= today]
                if candidates:
                    # Exact names beat prefixes, longer prefixes beat shorter ones, newer beats older.
                    return max(
                        candidates, key=lambda p: (not p.model.endswith("*"), len(p.model), p.effective)
                    )
        return None

    def knows(self, model: str) -> bool:
        """Whether any entry names ``model`` (exactly or by prefix), whatever its date: the table is
        also the operator's list of model names, so a misspelt one is refused before it is sent."""
        return any(
            p.matches(name)
            for name in _names(model)
            for source in (self._overrides, self._prices)
            for p in source
        )

    def names(self) -> list[str]:
        """The names and prefixes the table knows, the operator's own first (for messages)."""
        return list(dict.fromkeys(p.model for source in (self._overrides, self._prices) for p in source))

    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        price = self.lookup(model)
        return None if price is None else price.cost(usage)

    def with_overrides(self, entries: Iterable[Mapping[str, Any]]) -> PriceTable:
        extra = tuple(parse_price(entry) for entry in entries)
        return PriceTable(self._prices, overrides=(*self._overrides, *extra), today=self._today)

    @classmethod
    def load(cls, path: Path | None) -> PriceTable:
        table = cls()
        if path is None:
            return table
        raw = yaml.safe_load(path.read_text()) or {}
        entries = raw.get("prices", []) if isinstance(raw, dict) else raw
        if not isinstance(entries, list):
            raise ValueError(f"{path}: expected a list of prices under 'prices'")
        return table.with_overrides(entries)


def _names(model: str) -> tuple[str, ...]:
    """The ID as given (an operator's entry may name a provider's ID exactly, regional premium and
    all), then the Claude model it names (docs/providers/)."""
    claude = claude_model(model)
    return (model,) if claude == model else (model, claude)


def parse_price(entry: Mapping[str, Any]) -> Price:
    """An override entry: model, effective (date), input, output, optional cacheWrite/cacheRead."""
    try:
        inp = Decimal(str(entry["input"]))
        out = Decimal(str(entry["output"]))
        effective = dt.date.fromisoformat(str(entry.get("effective", "1970-01-01")))
        return Price(
            str(entry["model"]),
            effective,
            inp,
            out,
            Decimal(str(entry.get("cacheWrite", inp * Decimal("1.25")))),
            Decimal(str(entry.get("cacheRead", inp * Decimal("0.1")))),
        )
    except (KeyError, ValueError, ArithmeticError) as exc:
        raise ValueError(f"invalid price entry {dict(entry)!r}: {exc}") from exc
