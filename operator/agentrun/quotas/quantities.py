"""Kubernetes quantities ("500m", "1.5Gi", "2e3"), read exactly, and written back short.

Why a parser of our own, in Decimal: a quota adds up the CPU and memory limits of the sandboxes it
admits and compares the sum with its own limit, so "0.1" + "0.2" must be "300m" exactly, as the API
server's resource.Quantity counts it; a float would admit a sandbox one rounding error past the
limit. The grammar is the one the CRDs check (api/sandbox_spec.QUANTITY_PATTERN), so a value that
passed the API server always parses here; one that did not (an object stored before the pattern was
tightened) is a QuantityError naming it, never a silent zero.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, Inexact, InvalidOperation, Overflow, Underflow

from agentrun.api.sandbox_spec import QUANTITY_PATTERN
from agentrun.quotas.formats import decimal_text

_GRAMMAR = re.compile(QUANTITY_PATTERN)

#: Multipliers of the suffixes a quantity may end with; an exponent (e3, E-2) is handled apart.
BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
#: Enough digits for any quantity of the pattern's 64 characters times 2**60, so no product rounds;
#: an exponent beyond the bounds is refused rather than rounded to infinity or zero.
_EXACT = Context(prec=200, Emax=10_000, Emin=-10_000, traps=[Inexact, InvalidOperation, Overflow, Underflow])


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity >= 0; the message names the value."""


def parse_quantity(text: object) -> Decimal:
    """The exact amount a quantity stands for: cores for CPU ("500m" -> 0.5), bytes for memory."""
    if not isinstance(text, str):
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (a string such as 500m or 1Gi)")
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError(
            f"{text!r} is not a Kubernetes quantity: a number >= 0 with an optional suffix "
            "(n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei) or exponent (e3)"
        )
    number, suffix = Decimal(match.group(1)), match.group(3) or ""
    try:
        if suffix in BINARY_SUFFIXES:
            return _EXACT.multiply(number, Decimal(BINARY_SUFFIXES[suffix]))
        if suffix in DECIMAL_SUFFIXES:
            return _EXACT.multiply(number, DECIMAL_SUFFIXES[suffix])
        return _EXACT.multiply(number, _EXACT.power(Decimal(10), int(suffix[1:])))
    except (Inexact, InvalidOperation, Overflow, Underflow):
        raise QuantityError(f"{text!r} is out of the range a quota can count exactly") from None


def cpu_text(cores: Decimal) -> str:
    """CPU as a Kubernetes quantity: whole cores as a number ("2"), else millicores ("1500m") when
    exact, else the plain decimal ("0.0005"); every form reads back to the same amount."""
    if cores == cores.to_integral_value():
        return decimal_text(cores)
    millis = _EXACT.multiply(cores, Decimal(1000))
    if millis == millis.to_integral_value():
        return f"{decimal_text(millis)}m"
    return decimal_text(cores)


def memory_text(size: Decimal) -> str:
    """Bytes as a Kubernetes quantity, in the shortest exact form: "640Mi", "1G", "1500" (a binary
    suffix where it is as short); every form reads back to the same amount."""
    plain = decimal_text(size)
    if size == 0 or size != size.to_integral_value():
        return plain
    units = [*((s, Decimal(u)) for s, u in reversed(BINARY_SUFFIXES.items()))]
    units += [(s, DECIMAL_SUFFIXES[s]) for s in ("E", "P", "T", "G", "M", "k")]
    forms = [
        f"{decimal_text(_EXACT.divide(size, unit))}{suffix}"
        for suffix, unit in units
        if _EXACT.remainder(size, unit) == 0
    ]
    return min([*forms, plain], key=len)
