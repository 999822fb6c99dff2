"""What a sandbox pod's status says: its container running, or why it has not started.

Apart from pods.py because the warm pools (controller/agents/pools.py) read pods the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.tools.sandbox.manifests import CONTAINER

__all__ = ["container_running", "waiting_reason", "why_not_started"]


def container_running(pod: Mapping[str, Any]) -> bool:
    """The sandbox container runs: commands can be exec'd (a warm pool counts such pods as ready)."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return "running" in (status.get("state") or {})
    return False


def why_not_started(pod: Mapping[str, Any], spec: SandboxSpec) -> str:
    """What the pod's status says about a start that timed out, for the message.

    Measured on a real node: a PersistentVolumeClaim that does not exist leaves the pod unscheduled
    (PodScheduled False, the scheduler's message names the claim); a ConfigMap or Secret volume that
    does not exist leaves its container ContainerCreating, and only the pod's Events say why.
    """
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f": not scheduled: {condition.get('message') or condition.get('reason')}"
    waiting = waiting_reason(pod)
    mounted = [v for v in spec.volumes if v.config_map is not None or v.secret is not None]
    if waiting is not None and waiting[0] == "ContainerCreating" and mounted:
        return (
            ": a ConfigMap or Secret of spec.sandbox.volumes that is missing keeps a pod there "
            "(its Events say which: kubectl describe pod)"
        )
    return ""


def waiting_reason(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return str(waiting["reason"]), str(waiting.get("message") or "")
    return None
