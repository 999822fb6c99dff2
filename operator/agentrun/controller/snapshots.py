"""Kopf's live views of watched objects, as plain data."""

from __future__ import annotations

from typing import Any


def plain(value: Any) -> Any:
    """Kopf hands out live views that change under the reader; a run or a quota works on a stable
    snapshot instead."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
