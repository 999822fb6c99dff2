"""An AgentRun as the A2A task it answers: the run's phase read as a task state, its result as the
task's artifact. Pure: serving.py reads the run (as the caller) and sends what this makes of it.

AwaitingApproval reads as working, not input-required: input-required asks the *caller* to answer, but
a tool call is approved by the people the approval policy names (spec.approvals), and a caller who could
answer it would approve its own run's calls. The status message says what the run waits for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun.a2a import protocol
from agentrun.api import LABEL_AGENT

#: The A2A contextId a task was sent with, kept on its run.
CONTEXT_ANNOTATION = "agentrun.dev/a2a-context-id"
#: Who sent the task (the API server's name for the caller): a retried send finds its own run only.
CALLER_ANNOTATION = "agentrun.dev/a2a-caller"
#: Marks the runs made from A2A tasks (kubectl get ar -l agentrun.dev/a2a=true).
LABEL_A2A = "agentrun.dev/a2a"

STATES = {
    "Pending": protocol.SUBMITTED,
    "Running": protocol.WORKING,
    "AwaitingApproval": protocol.WORKING,
    "Succeeded": protocol.COMPLETED,
    "Failed": protocol.FAILED,
    "Cancelled": protocol.CANCELED,
}


def run_manifest(
    name: str, namespace: str, agent: str, text: str, *, context_id: str, caller: str
) -> dict[str, Any]:
    """The AgentRun a task becomes: the Agent's, with the task's text as its task."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_AGENT: agent, LABEL_A2A: "true"},
            "annotations": {CONTEXT_ANNOTATION: context_id, CALLER_ANNOTATION: caller},
        },
        "spec": {"task": text, "agentRef": {"name": agent}},
    }


def of_agent(run: Mapping[str, Any], agent: str) -> bool:
    """Whether the run was made from a task sent to this Agent (else: not one of its tasks)."""
    metadata = run.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return labels.get(LABEL_AGENT) == agent and labels.get(LABEL_A2A) == "true"


def state(run: Mapping[str, Any]) -> str:
    status = run.get("status") or {}
    return STATES.get(str(status.get("phase") or "Pending"), protocol.SUBMITTED)


def task(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run as an A2A Task: state, a status message while it waits or after it failed, the result."""
    metadata = run.get("metadata") or {}
    status = run.get("status") or {}
    ids = {"taskId": str(metadata.get("name")), "contextId": context_id(run)}
    answer: dict[str, Any] = {"id": ids["taskId"], "contextId": ids["contextId"], "status": task_status(run)}
    artifact = result_artifact(run)
    if artifact is not None:
        answer["artifacts"] = [artifact]
    answer["metadata"] = {
        "namespace": metadata.get("namespace"),
        "agentRun": metadata.get("name"),
        "phase": status.get("phase") or "Pending",
        **({"stopReason": status["stopReason"]} if status.get("stopReason") else {}),
    }
    return answer


def context_id(run: Mapping[str, Any]) -> str:
    metadata = run.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return str(annotations.get(CONTEXT_ANNOTATION) or metadata.get("uid") or metadata.get("name"))


def task_status(run: Mapping[str, Any]) -> dict[str, Any]:
    metadata = run.get("metadata") or {}
    status = run.get("status") or {}
    current = state(run)
    answer: dict[str, Any] = {"state": current}
    said = _status_words(status, current)
    if said:
        ids = {"taskId": str(metadata.get("name")), "contextId": context_id(run)}
        answer["message"] = protocol.text_message(
            said, message_id=f"{metadata.get('name')}-status", role=protocol.ROLE_AGENT, **ids
        )
    when = status.get("completionTime") or status.get("startTime") or metadata.get("creationTimestamp")
    if when:
        answer["timestamp"] = when
    return answer


def _status_words(status: Mapping[str, Any], current: str) -> str:
    if status.get("phase") == "AwaitingApproval":
        names = ", ".join(str(p.get("toolName")) for p in status.get("pendingApprovals") or [])
        return (
            f"waiting for a person to approve a tool call ({names or 'pending'}): {status.get('message', '')}"
        )
    if current in (protocol.FAILED, protocol.CANCELED, protocol.SUBMITTED):
        return str(status.get("message") or "")
    return ""


def result_artifact(run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The finished run's answer: its structured output as a data part, else its result as text."""
    status = run.get("status") or {}
    if status.get("phase") != "Succeeded":
        return None
    if status.get("output") is not None:
        parts: list[dict[str, Any]] = [{"data": status["output"], "mediaType": "application/json"}]
    else:
        parts = [{"text": str(status.get("result") or ""), "mediaType": "text/plain"}]
    return {"artifactId": "result", "name": "result", "parts": parts}


def status_update(run: Mapping[str, Any]) -> dict[str, Any]:
    """A streamed event: the task's new status."""
    update = {"taskId": str((run.get("metadata") or {}).get("name")), "contextId": context_id(run)}
    return {"statusUpdate": {**update, "status": task_status(run)}}


def artifact_update(run: Mapping[str, Any], artifact: Mapping[str, Any]) -> dict[str, Any]:
    """A streamed event: the finished run's answer, whole (one chunk)."""
    update = {"taskId": str((run.get("metadata") or {}).get("name")), "contextId": context_id(run)}
    return {"artifactUpdate": {**update, "artifact": dict(artifact), "lastChunk": True}}
