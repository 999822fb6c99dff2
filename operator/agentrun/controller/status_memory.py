"""What this process last wrote to an object's status, until the watch brings it back.

Why: a status patch and the watch event that carries it back are apart by up to a second (more on a
busy API server); a pass that meanwhile reads the older body would see its own write missing and write
it again, or act on a schedule time twice. So a controller reads an object's status as the body's,
overlaid with what it wrote since. Agents and schedules both do (controller/agents/, controller/schedules/).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["WrittenStatus"]


class WrittenStatus:
    def __init__(self) -> None:
        self._by_uid: dict[str, dict[str, Any]] = {}

    def current(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The object's status as this process knows it: the body's, then what it wrote since."""
        uid = (body.get("metadata") or {}).get("uid") or ""
        return {**(body.get("status") or {}), **self._by_uid.get(uid, {})}

    def wrote(self, uid: str, status: Mapping[str, Any]) -> None:
        self._by_uid[uid] = {**self._by_uid.get(uid, {}), **status}

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)
