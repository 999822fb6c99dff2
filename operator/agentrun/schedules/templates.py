"""The names and tasks of the runs a schedule creates.

The name is a function of the scheduled time, so a restarted operator (or a second replica) creating the
run for the same time gets 409 AlreadyExists instead of a duplicate.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping

from agentrun.api.times import rfc3339

__all__ = ["PLACEHOLDERS", "TemplateError", "render", "run_name", "unknown_placeholders"]

PLACEHOLDERS = ("scheduledTime", "scheduleName", "namespace")
NAME_PREFIX_CHARS = 42
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")


class TemplateError(ValueError):
    """A one-line explanation of what is wrong with spec.task."""


def run_name(schedule: str, scheduled: dt.datetime) -> str:
    """`<schedule[:42]>-<unix minutes of the scheduled time>`, as a CronJob names its Jobs."""
    prefix = schedule[:NAME_PREFIX_CHARS].rstrip(".-")
    return f"{prefix}-{int(scheduled.timestamp()) // 60}"


def unknown_placeholders(template: str) -> list[str]:
    return sorted({m.group(1) for m in _PLACEHOLDER.finditer(template)} - set(PLACEHOLDERS))


def render(template: str, *, scheduled: dt.datetime, schedule: str, namespace: str) -> str:
    """spec.task with {{scheduledTime}} (RFC 3339, UTC), {{scheduleName}} and {{namespace}} filled in."""
    unknown = unknown_placeholders(template)
    if unknown:
        raise TemplateError(
            f"spec.task has unknown placeholder(s) {', '.join('{{' + u + '}}' for u in unknown)}; "
            f"known: {', '.join('{{' + p + '}}' for p in PLACEHOLDERS)}"
        )
    values: Mapping[str, str] = {
        "scheduledTime": rfc3339(scheduled),
        "scheduleName": schedule,
        "namespace": namespace,
    }
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
