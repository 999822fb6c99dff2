"""How amounts and instants are written into a quota's status, and read back leniently.

Why strings for dollars: a JSON number goes through a float on its way into most clients, and a
ledger that must never pass a limit cannot afford 0.1 + 0.2 = 0.30000000000000004. Why lenient
reading: the status is the only memory of usage across processes; a field someone edited by hand
must not crash the operator, and the ledger decides what an unreadable value means (conservatively).
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

CENT = Decimal("0.01")


def decimal_text(value: Decimal) -> str:
    """The exact value, without exponent or trailing zeros: "0.3", "50", "0.0000001"."""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def cents_text(value: Decimal, *, below: Decimal | None = None) -> str:
    """Dollars to the cent, for printer columns only (the ledger keeps the exact value). Against a
    limit ``below`` a dollar, to a hundredth of a cent, so the use of a small limit does not read 0.00."""
    step = Decimal("0.0001") if below is not None and below < 1 else CENT
    return format(value.quantize(step, rounding=ROUND_HALF_UP), "f")


def parse_decimal(raw: object) -> Decimal | None:
    """A finite amount >= 0, or None for anything else (bool, NaN, negative, not a number)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float | Decimal):
        return None
    try:
        value = Decimal(str(raw).strip()) if not isinstance(raw, Decimal) else raw
    except InvalidOperation:
        return None
    if not value.is_finite() or value < 0:
        return None
    return value


def parse_count(raw: object) -> int | None:
    """A whole number >= 0 (an int, or a string of digits), or None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw if raw >= 0 else None
    if isinstance(raw, str) and raw.strip().isdigit():
        return int(raw.strip())
    return None


def utc(at: dt.datetime) -> dt.datetime:
    """Windows and buckets are aligned in UTC; a naive time would silently shift them by the local offset."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"quota accounting needs an aware time (UTC), got the naive {at.isoformat()}")
    return at.astimezone(dt.UTC)


def to_second(at: dt.datetime) -> dt.datetime:
    """The instant as stored (RFC 3339 to the second), so that a time survives a status round trip."""
    return utc(at).replace(microsecond=0)
