"""Kubernetes Events on an AgentSchedule: what `kubectl describe agentschedule` shows.

One Event per thing that happened to a due time (created, skipped, missed), so a schedule firing every
minute posts at most one or two a minute. Posting never stops the schedule: a failure is logged once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agentrun.api import API_VERSION, SCHEDULE_KIND
from agentrun.controller.kube_eventing import bounded, new_event
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIError

logger = logging.getLogger(__name__)


class ScheduleEvents:
    def __init__(self, kube: KubeClient, *, instance: str) -> None:
        """``instance``: this replica's name (Settings.replica_name), the Events' reportingInstance."""
        self._kube = kube
        self._instance = instance
        self._failed = False

    async def post(self, schedule: dict[str, Any], kind: str, reason: str, message: str) -> None:
        metadata = schedule.get("metadata") or {}
        namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
        body = new_event(
            name=f"{name}.{time.time_ns():x}",
            involved={
                "apiVersion": API_VERSION,
                "kind": SCHEDULE_KIND,
                "namespace": namespace,
                "name": name,
                "uid": metadata.get("uid") or "",
            },
            kind=kind,
            reason=reason,
            message=bounded(message),
            instance=self._instance,
        )
        try:
            await self._kube.create_event(namespace, body)
        except APIError as exc:
            if not self._failed:
                logger.warning("could not post a Kubernetes Event (further failures not logged): %s", exc)
                self._failed = True
