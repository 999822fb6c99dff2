"""Kopf handlers: thin. They read the object, hand it to the run service and get out of the way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.api import GROUP, PLURAL, VERSION
from agentrun.api.conditions import observed_generation_patch
from agentrun.api.status import FINISHED_PHASES
from agentrun.controller.running import RunRef, RunService
from agentrun.controller.ttl_reaping import TTLReaper

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
    reaper = TTLReaper(service.kube, service.settings.default_ttl_seconds_after_finished)

    @kopf.on.cleanup(registry=registry)
    async def stop_reaper(**_: Any) -> None:
        await reaper.close()

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
        """Cancel requests and approvals reach the running loop within one watch event, no polling."""
        uid = body.metadata.uid
        if event.get("type") == "DELETED":
            reaper.forget(uid)
            service.cancels.pop(uid, None)
            return
        spec, status = body.get("spec", {}), body.get("status", {})
        if status.get("phase") in FINISHED_PHASES:
            reaper.observe(body.metadata.namespace or "", body.metadata.name or "", uid, spec, status)
            # A spec change after (or racing) the end: observed, so kstatus reads the run as final.
            patch = observed_generation_patch(_plain(status), body.metadata.get("generation"))
            if patch is not None:
                with contextlib.suppress(ApiException):  # gone or conflicting: the next event retries
                    await service.kube.patch_run_status(
                        body.metadata.namespace or "", body.metadata.name or "", patch
                    )
            return
        if spec.get("cancel"):
            # Also before the daemon registered the run: it finds the request when it starts.
            service.request_cancel(uid)
        approvals = body.get("spec", {}).get("approvals")
        if approvals:
            service.update_approvals(body.metadata.uid, _plain(approvals))

    return registry
