"""The one writer of the status of Agents and schedules: a status model in, a merge patch out, sent
only when it changes something, and remembered until the watch brings it back.

Why a model: the CRD's status schema is generated from the same model (api/agent.py, api/schedule.py),
and the API server prunes status fields the schema lacks, silently; a patch dumped from the model names
only fields the schema has. Why remembered: a status patch and the watch event that carries it back are
apart by up to a second (more on a busy API server); a pass that meanwhile reads the older body would see
its own write missing and write it again, or act on a schedule time twice. So a controller reads an
object's status as the body's, overlaid with what it wrote since. (A run's status has its own writer,
controller/agentruns/status_writing.py; a quota's ledger is written whole, controller/quotas/writing.py.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["WrittenStatus", "status_patch"]


def status_patch(status: BaseModel, *, cleared: Collection[str] = ()) -> dict[str, Any]:
    """The merge patch writing ``status``: the fields set on it, camelCase as stored. A field set to None
    is left out (never a null over a value someone else wrote) unless it is ``cleared`` (by field name)."""
    fields = type(status).model_fields
    nulls = {fields[name].alias or name for name in cleared}
    body = status.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return {key: value for key, value in body.items() if value is not None or key in nulls}


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

    async def write(
        self,
        body: Mapping[str, Any],
        status: BaseModel,
        send: Callable[[dict[str, Any]], Awaitable[object]],
        *,
        cleared: Collection[str] = (),
    ) -> dict[str, Any] | None:
        """Sends the patch of ``status`` unless the object's status, as this process knows it, says it
        all already; returns the patch sent (None: nothing to write). What ``send`` raises propagates."""
        patch = status_patch(status, cleared=cleared)
        current = self.current(body)
        if all(current.get(key) == value for key, value in patch.items()):
            return None
        await send(patch)
        self.wrote((body.get("metadata") or {}).get("uid") or "", patch)
        return patch
