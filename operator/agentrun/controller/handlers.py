"""Kopf handlers: thin. They read the object, hand it to the run service and get out of the way."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.api import GROUP, PLURAL, VERSION
from agentrun.api.conditions import observed_generation_patch
from agentrun.api.status import FINISHED_PHASES
from agentrun.controller import kubeconfig_loading
from agentrun.controller.kube_failures import KubeFailure
from agentrun.controller.kubeconfig_loading import ClusterAccess
from agentrun.controller.run_service import RunRef, RunService
from agentrun.controller.supervising import RunSupervisor
from agentrun.controller.ttl_reaping import TTLReaper

logger = logging.getLogger(__name__)
run_logger = logging.getLogger("agentrun.run")


def _plain(value: Any) -> Any:
    """Kopf's live views → plain data, so the run works on a stable snapshot of the spec."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def connection_info(access: ClusterAccess, *, trust_env: bool = False) -> kopf.ConnectionInfo:
    """Kopf's view of resolved credentials; an exec plugin's expiry makes Kopf log in again in time."""
    scheme, _, token = (access.authorization or "").partition(" ")
    return kopf.ConnectionInfo(
        server=access.server,
        ca_path=access.ca_path,
        insecure=access.insecure,
        certificate_path=access.certificate_path,
        private_key_path=access.private_key_path,
        scheme=scheme or None,
        token=token or None,
        default_namespace=access.namespace,
        proxy_url=access.proxy,
        trust_env=trust_env,
        expiration=access.expiration,
    )


def build_registry(service: RunService) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    reaper = TTLReaper(service.kube, service.settings.default_ttl_seconds_after_finished)

    @kopf.on.cleanup(registry=registry)
    async def stop_reaper(**_: Any) -> None:
        await reaper.close()

    @kopf.on.login(registry=registry)
    async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        """kubectl's resolution, shared with our own client: Kopf's kubeconfig login reads relative paths
        against the working directory and knows no tokenFile or exec plugin (kubeconfig_loading.py)."""
        try:
            access = await kubeconfig_loading.load()
        except KubeFailure as exc:  # e.g. an exec plugin failing at a re-login: retried, said in one line
            raise kopf.TemporaryError(str(exc), delay=10) from exc
        return connection_info(access, trust_env=settings.networking.trust_env)

    async def execute(body: Mapping[str, Any], stopping: Callable[[], bool]) -> None:
        metadata = body.get("metadata") or {}
        run = RunRef(
            namespace=metadata.get("namespace") or "",
            name=metadata.get("name") or "",
            uid=metadata.get("uid") or "",
            generation=metadata.get("generation"),
            spec=_plain(body.get("spec") or {}),
            status=_plain(body.get("status") or {}),
        )
        await service.execute(run, stopping=stopping, log=run_logger)

    supervisor = RunSupervisor(execute)

    @kopf.on.cleanup(registry=registry)
    async def stop_runs(**_: Any) -> None:
        await supervisor.close()

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def watch_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        """Cancel requests and approvals reach the running loop within one watch event, no polling."""
        uid = body.metadata.uid
        supervisor.observe(event.get("type"), body)
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
            # Also before the run task registered the run: it finds the request when it starts.
            service.request_cancel(uid)
        approvals = body.get("spec", {}).get("approvals")
        if approvals:
            service.update_approvals(body.metadata.uid, _plain(approvals))

    return registry
