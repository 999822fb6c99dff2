"""Kopf handlers: thin. They read the object, hand it to the run service and get out of the way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from agentrun.api import GROUP, PLURAL, VERSION
from agentrun.api.status import FINISHED_PHASES
from agentrun.controller.running import RunRef, RunService

logger = logging.getLogger(__name__)


def _unfinished(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") not in FINISHED_PHASES


def _plain(value: Any) -> Any:
    """Kopf's live views → plain data, so the run works on a stable snapshot of the spec."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def build_registry(service: RunService) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """In-cluster service account first, then KUBECONFIG: our registry has no default login."""
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        return info or kopf.login_with_kubeconfig(**kwargs)

    @kopf.daemon(  # type: ignore[arg-type]
        GROUP,
        VERSION,
        PLURAL,
        id="run",
        registry=registry,
        when=_unfinished,
        # Asked politely first: when our own terminal status patch flips `when`, the daemon is
        # already returning and must not be cancelled mid-write.
        cancellation_backoff=10.0,
        cancellation_timeout=30.0,
    )
    async def run_daemon(
        body: kopf.Body,
        meta: kopf.Meta,
        namespace: str,
        name: str,
        uid: str,
        stopped: kopf.DaemonStopped,
        logger: kopf.Logger,
        **_: Any,
    ) -> None:
        run = RunRef(
            namespace=namespace,
            name=name,
            uid=uid,
            generation=meta.get("generation"),
            spec=_plain(body.get("spec", {})),
            status=_plain(body.get("status", {})),
        )
        work = asyncio.ensure_future(service.execute(run, stopping=stopped.is_set, log=logger))
        halt = asyncio.ensure_future(stopped.wait())
        try:
            await asyncio.wait({work, halt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, halt):
                if not task.done():
                    task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await halt
        if work.cancelled():
            return
        with contextlib.suppress(asyncio.CancelledError):
            await work

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def watch_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        """Cancel requests reach the running loop within one watch event, without polling."""
        if event.get("type") == "DELETED":
            return
        if body.get("spec", {}).get("cancel") and body.metadata.uid in service.cancels:
            service.request_cancel(body.metadata.uid)

    return registry
