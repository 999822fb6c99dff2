"""What CEL callers catch, and the marker for a value that is not there.

Apart from the parser and the interpreter so that callers (schema validation, admission policies) can
name them without reaching into either.
"""

from __future__ import annotations

from typing import Any

#: An absent value: ``oldSelf`` on create, a field the object does not have. Never equal to any JSON value.
MISSING: Any = object()


class CelUnsupported(ValueError):
    """The expression uses CEL outside the supported subset."""


class CelEvalError(ValueError):
    """Evaluation failed (missing key, type mismatch); CEL reports this as a failed rule."""
