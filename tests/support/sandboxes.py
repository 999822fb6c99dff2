"""Sandboxes for integration scenarios: one that never starts, and the rights its account needs.

Why one that never starts: the scenarios on the emulator and on a real API server check what the
operator does around the pod (who creates it, how it is isolated, what waits and what is counted), and
a pod whose image no node has and none may pull behaves the same on both, with or without a node: a
node refuses it at once (ErrImageNeverPull), no node leaves it Pending until the start timeout.
"""

from __future__ import annotations

import copy
from typing import Any

from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block

#: An image no node has and none may pull (imagePullPolicy Never).
MISSING_IMAGE = "localhost/agentrun-sandbox-absent:none"
#: What a run's ServiceAccount needs for a sandbox: pods (list: to find a warm pool pod), and exec.
SANDBOX_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete", "list"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
]
RESOURCES = {
    "requests": {"cpu": "100m", "memory": "64Mi"},
    "limits": {"cpu": "500m", "memory": "128Mi"},
}


def unstartable_sandbox(image: str = MISSING_IMAGE, **fields: Any) -> dict[str, Any]:
    """spec.sandbox of a pod that never runs (``image`` no node has), failing within 10 s."""
    return {
        "image": image,
        "imagePullPolicy": "Never",
        "resources": copy.deepcopy(RESOURCES),
        "startTimeoutSeconds": 10,
        **fields,
    }


def one_command(tag: str, tool_use_id: str | None = None) -> Script:
    """The model's side of a run whose sandbox never starts: one `make test`, then an answer."""
    command = tool_use_block("bash", {"command": "make test"}, **({"id": tool_use_id} if tool_use_id else {}))
    return Script(tag, [Reply([command]), Reply([text_block("The sandbox did not start.")])])
