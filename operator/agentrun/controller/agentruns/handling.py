"""What one watch event of an AgentRun sets in motion; Kopf's handler only passes the event here.

An unfinished run gets its execution started (supervising.py) or, when deleted, stopped; a cancel
request or a new spec.approvals reaches the executing run within that one event, no polling; a
finished run gets its TTL deletion scheduled and a later spec change marked observed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from agentrun.api.status import FINISHED_PHASES
from agentrun.controller.agentruns.reconciler import AgentRunReconciler, RunRef
from agentrun.controller.agentruns.status_writing import mark_observed
from agentrun.controller.agentruns.supervising import RunSupervisor
from agentrun.controller.agentruns.ttl_reaping import TTLReaper
from agentrun.controller.snapshots import plain

run_logger = logging.getLogger("agentrun.run")


def priority_of(spec: Mapping[str, Any]) -> int:
    """spec.priority (default 0); the CRD bounds it, so anything else is read as the default."""
    value = spec.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class AgentRunHandler:
    def __init__(self, reconciler: AgentRunReconciler) -> None:
        self.reconciler = reconciler
        self.reaper = TTLReaper(reconciler.kube, reconciler.settings.default_ttl_seconds_after_finished)
        self.supervisor = RunSupervisor(self._execute)

    async def _execute(self, body: Mapping[str, Any], stopping: Callable[[], bool]) -> None:
        metadata = body.get("metadata") or {}
        ref = RunRef(
            namespace=metadata.get("namespace") or "",
            name=metadata.get("name") or "",
            uid=metadata.get("uid") or "",
            generation=metadata.get("generation"),
            spec=plain(body.get("spec") or {}),
            status=plain(body.get("status") or {}),
            created=str(metadata.get("creationTimestamp") or ""),
            priority=priority_of(body.get("spec") or {}),
        )
        await self.reconciler.reconcile(ref, stopping=stopping, log=run_logger)

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """One watch event (None: from the initial listing)."""
        metadata = body.get("metadata") or {}
        uid = metadata.get("uid") or ""
        self.supervisor.observe(event_type, body)
        if event_type == "DELETED":
            self.reaper.forget(uid)
            self.reconciler.forget(uid)
            return
        spec, status = body.get("spec") or {}, body.get("status") or {}
        namespace, name = metadata.get("namespace") or "", metadata.get("name") or ""
        if status.get("phase") in FINISHED_PHASES:
            self.reaper.observe(namespace, name, uid, spec, status)
            # A spec change after (or racing) the end: observed, so kstatus reads the run as final.
            await mark_observed(
                self.reconciler.kube, namespace, name, plain(status), metadata.get("generation")
            )
            return
        if spec.get("cancel"):
            # Also before the run task registered the run: it finds the request when it starts.
            self.reconciler.request_cancel(uid)
        # spec.priority is mutable: a run waiting for a slot takes its new place in the queue.
        self.reconciler.update_priority(uid, priority_of(spec))
        approvals = spec.get("approvals")
        if approvals:
            self.reconciler.update_approvals(uid, plain(approvals))

    async def close(self) -> None:
        """Operator shutdown: runs stop writing at once; a restart resumes them from the transcript."""
        await self.supervisor.close()
        await self.reaper.close()
