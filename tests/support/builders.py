"""AgentRun manifests for tests, with only the fields a test cares about spelled out."""

from __future__ import annotations

from typing import Any


def agentrun(name: str, task: str, *, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"task": task, **spec}
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def agent(name: str, *, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """An Agent: what runs with spec.agentRef {name} run."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
