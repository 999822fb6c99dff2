"""Errors raised while turning spec.tools into a tool set (never while a tool runs)."""

from __future__ import annotations


class InvalidToolSpec(ValueError):
    """The spec's tools cannot form a valid tool set; the message names the offending tool."""
