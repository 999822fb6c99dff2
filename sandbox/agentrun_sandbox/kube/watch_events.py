"""Watch plumbing of the emulated API server: the event history and per-stream filtered queues.

Every write appends one event to its resource's history (for ``?watch=true&resourceVersion=N``
resumption) and offers it to the live streams of that resource. A stream with a selector sees the
transitions a real server reports: an object that starts matching arrives as ADDED, one that stops
matching leaves as DELETED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.kube.registry import ResourceType
from agentrun_sandbox.kube.selectors import FieldSelector, LabelSelector


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A change as stored: ``old`` is the previous state (None for ADDED), ``new`` the resulting one."""

    rv: int
    type: str
    old: Mapping[str, Any] | None
    new: Mapping[str, Any]


class Watcher:
    """One open watch stream: its filter and the queue of events that passed it (``None`` ends it)."""

    def __init__(
        self,
        rtype: ResourceType,
        *,
        namespace: str | None,
        name: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
    ) -> None:
        self.rtype = rtype
        self.namespace = namespace
        self.name = name
        self.labels = labels
        self.fields = fields
        self.queue: asyncio.Queue[tuple[str, Mapping[str, Any]] | None] = asyncio.Queue()

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.name is not None and meta.get("name") != self.name:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)

    def translate(self, event: StoredEvent) -> tuple[str, Mapping[str, Any]] | None:
        was = self.matches(event.old)
        now = self.matches(event.new)
        if event.type == "ADDED":
            return ("ADDED", event.new) if now else None
        if event.type == "DELETED":
            return ("DELETED", event.new) if now or was else None
        if was and now:
            return ("MODIFIED", event.new)
        if now:
            return ("ADDED", event.new)
        if was:
            return ("DELETED", event.new)
        return None

    def offer(self, event: StoredEvent) -> None:
        translated = self.translate(event)
        if translated is not None:
            self.queue.put_nowait(translated)

    def close(self) -> None:
        self.queue.put_nowait(None)
