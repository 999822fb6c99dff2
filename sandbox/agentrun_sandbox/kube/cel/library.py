"""CEL's value semantics and its standard functions, as the API server's cel-go answers them.

Kept apart from the tree walk because this is where the emulator must agree with a real server
value by value: equality that never mixes types, integer division, the exact overload and slice
messages a rule failure shows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from agentrun_sandbox.kube.cel.errors import CelEvalError


def equal(a: Any, b: Any) -> bool:
    """CEL's ``==``: no conversion between bools, numbers, strings, lists and maps."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping | list) or isinstance(b, Mapping | list):
        return False
    if isinstance(a, str) != isinstance(b, str):
        return False
    return bool(a == b)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def size(value: Any) -> int:
    if isinstance(value, str | list | Mapping):
        return len(value)
    raise CelEvalError("no such overload: size")


def to_string(value: Any) -> str:
    """``string()``: the conversions a message needs, rendered as CEL renders them."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if is_number(value):
        return _go_float(value) if isinstance(value, float) else str(value)
    raise CelEvalError("no such overload: string")


def _go_float(value: float) -> str:
    """A double as cel-go converts it: Go's ``strconv.FormatFloat(d, 'g', -1, 64)`` (2.0 is "2",
    1e21 is "1e+21", 1e-5 is "1e-05"): the shortest digits that read back, exponent form from 1e+06."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    mantissa, _, exponent = f"{abs(value)!r}".lower().partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    point = len(whole) + int(exponent or 0) - (len(whole + fraction) - len((whole + fraction).lstrip("0")))
    digits = digits.rstrip("0") or "0"
    exp = point - 1
    if exp < -4 or exp >= 6:
        tail = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{tail}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def index(target: Any, key: Any) -> Any:
    """``target[key]`` on a list (integral index) or a map."""
    if isinstance(target, list) and is_number(key) and int(key) == key:
        if 0 <= int(key) < len(target):
            return target[int(key)]
        raise CelEvalError(f"index out of bounds: {key}")
    if isinstance(target, Mapping) and isinstance(key, str) and key in target:
        return target[key]
    raise CelEvalError(f"no such key: {key!r}")


def call_method(target: Any, name: str, args: list[Any]) -> Any:
    """``target.name(args...)`` for the receiver-style functions of the subset."""
    if name == "size" and not args:
        return size(target)
    if name == "slice" and isinstance(target, list) and len(args) == 2 and all(map(is_integer, args)):
        start, end = args  # the checks and messages of cel-go's lists extension
        if start < 0 or end < 0:
            raise CelEvalError(f"cannot slice({start}, {end}), negative indexes not supported")
        if start > end:
            raise CelEvalError(
                f"cannot slice({start}, {end}), start index must be less than or equal to end index"
            )
        if len(target) < end:
            raise CelEvalError(f"cannot slice({start}, {end}), list is length {len(target)}")
        return target[start:end]
    if isinstance(target, str) and len(args) == 1 and isinstance(args[0], str):
        if name == "startsWith":
            return target.startswith(args[0])
        if name == "endsWith":
            return target.endswith(args[0])
        if name == "contains":
            return args[0] in target
        if name == "matches":
            return re.search(args[0], target) is not None
    raise CelEvalError(f"no such overload: {name}")


def apply_operator(op: str, a: Any, b: Any) -> Any:
    """A binary operator other than ``&&``/``||`` (those need the unevaluated operands)."""
    if op == "==":
        return equal(a, b)
    if op == "!=":
        return not equal(a, b)
    if op == "in":
        if isinstance(b, list):
            return any(equal(a, item) for item in b)
        if isinstance(b, Mapping):
            return a in b
        raise CelEvalError("no such overload: _in_")
    comparable = (is_number(a) and is_number(b)) or (isinstance(a, str) and isinstance(b, str))
    if op in ("<", "<=", ">", ">="):
        if not comparable:
            raise CelEvalError(f"no such overload: _{op}_")
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op == "+" and (comparable or (isinstance(a, list) and isinstance(b, list))):
        return a + b
    if is_number(a) and is_number(b):
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0 and op in ("/", "%"):
            raise CelEvalError("division by zero")
        if op == "/":
            return a // b if isinstance(a, int) and isinstance(b, int) else a / b
        if op == "%":
            return a % b
    raise CelEvalError(f"no such overload: _{op}_")
