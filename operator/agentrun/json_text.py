"""JSON to and from bytes on the operator's busiest paths: the model request body, the transcript
record, the bodies of API writes, watch events, the model's answers and the loop's size estimates.

Why not the json module there: at 1000 runs its encoder and decoder were about a tenth of the
operator's CPU (#32, docs/benchmarks.md). orjson writes the same compact text about twenty times
faster, and jiter (the SDK's own parser) reads about two and a half times faster. Neither may change
what a value means, so:

- :func:`encode` writes what ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)`` writes
  for JSON's own types. What orjson refuses (an integer past 64 bits, a key that is not a string, a
  type it does not know, nesting past 254 levels) goes to the json module with the same settings, so
  such a value is written or refused as before. Dataclasses and datetimes go to ``default`` as with
  json (orjson would write them itself).
- :func:`decode` keeps an integer of any size exact (orjson would make a float of it), reads NaN and
  Infinity as json.loads does, keeps the last of repeated keys, and raises json.JSONDecodeError.

- ``allow_nan=False`` refuses a float NaN or infinity with json's ValueError, as the SDK's encoder does
  for a request body: orjson writes them as ``null``, so a text with ``null`` in it is written again by
  the json module, which refuses them or gives the same text.

Differences left, none of which the operator's documents hold: with ``allow_nan`` (the default) a NaN or
infinity is written as ``null`` (json writes ``NaN``, which JSON readers refuse); a UUID or an Enum that
is not also a str or int is written as its value (json hands them to ``default``); a float with a small
exponent is written ``1e-7`` (json: ``1e-07``, the same number).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jiter
import orjson

_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def encode(value: Any, *, default: Callable[[Any], Any] | None = None, allow_nan: bool = True) -> bytes:
    """Compact UTF-8 JSON of ``value``; ``default`` and ``allow_nan`` as json.dumps takes them."""
    try:
        data = orjson.dumps(value, default=default, option=_OPTIONS)
    except orjson.JSONEncodeError:
        return _json_module(value, default, allow_nan)
    if not allow_nan and b"null" in data:
        return _json_module(value, default, allow_nan)
    return data


def _json_module(value: Any, default: Callable[[Any], Any] | None, allow_nan: bool) -> bytes:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=default, allow_nan=allow_nan)
    return text.encode()


def decode(data: bytes) -> Any:
    """The value of one JSON document; json.JSONDecodeError (a ValueError) when it is not one."""
    try:
        return jiter.from_json(data)
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc), data.decode(errors="replace"), 0) from None
