"""A2A 0.3's JSON-RPC methods on the same server: ``message/send``, ``message/stream``, ``tasks/get`` and
``tasks/cancel``, read into their 1.0 form and answered in 0.3's shapes.

Many agents and clients in use still speak 0.3 (the method names above, ``kind`` on every object and
part, lower-case task states such as ``input-required``, roles ``user`` and ``agent``, ``blocking`` instead
of ``returnImmediately``). The server does the work once, in 1.0 terms (protocol.py); this module only
translates at the edges, so both versions answer from the same run. The Agent Card stays 1.0's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun.a2a import protocol

#: 0.3's method names, and the 1.0 method each is served as.
METHODS = {
    "message/send": protocol.SEND,
    "message/stream": protocol.STREAM,
    "tasks/get": protocol.GET_TASK,
    "tasks/cancel": protocol.CANCEL_TASK,
}
_STATE_PREFIX = "TASK_STATE_"
_ROLES = {protocol.ROLE_USER: "user", protocol.ROLE_AGENT: "agent"}


def params(method: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """0.3 params as 1.0's: file parts named as 1.0 names them (so they are refused alike), and
    ``configuration.blocking: false`` as ``returnImmediately``."""
    translated = dict(given)
    if METHODS[method] not in (protocol.SEND, protocol.STREAM):
        return translated
    message = given.get("message")
    if isinstance(message, Mapping):
        parts = message.get("parts")
        listed = parts if isinstance(parts, list) else []
        translated["message"] = {**message, "parts": [_part_in(p) for p in listed if isinstance(p, Mapping)]}
    configuration = given.get("configuration")
    if isinstance(configuration, Mapping) and configuration.get("blocking") is False:
        translated["configuration"] = {**configuration, "returnImmediately": True}
    return translated


def _part_in(part: Mapping[str, Any]) -> dict[str, Any]:
    if part.get("kind") == "file":
        found = part.get("file")
        file: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        return {"url": file.get("uri", "")} if "uri" in file else {"raw": file.get("bytes", "")}
    return {key: value for key, value in part.items() if key != "kind"}


def result(value: Mapping[str, Any]) -> dict[str, Any]:
    """A 1.0 result (or streamed event) in 0.3's shape."""
    if "task" in value:
        return task(value["task"])
    if "statusUpdate" in value:
        update = value["statusUpdate"]
        state = str(update["status"].get("state", ""))
        return {
            "kind": "status-update",
            "taskId": update["taskId"],
            "contextId": update["contextId"],
            "status": _status(update["status"]),
            "final": state in protocol.TERMINAL or state in protocol.INTERRUPTED,
        }
    if "artifactUpdate" in value:
        update = value["artifactUpdate"]
        return {
            "kind": "artifact-update",
            "taskId": update["taskId"],
            "contextId": update["contextId"],
            "artifact": _artifact(update["artifact"]),
            "lastChunk": bool(update.get("lastChunk", True)),
        }
    return task(value)  # GetTask and CancelTask answer the task itself


def task(value: Mapping[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "kind": "task",
        "id": value["id"],
        "contextId": value["contextId"],
        "status": _status(value["status"]),
    }
    if value.get("artifacts"):
        answer["artifacts"] = [_artifact(a) for a in value["artifacts"]]
    if value.get("metadata"):
        answer["metadata"] = dict(value["metadata"])
    return answer


def state(value: str) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` → ``input-required``."""
    return value.removeprefix(_STATE_PREFIX).lower().replace("_", "-")


def _status(status: Mapping[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = {"state": state(str(status.get("state", "")))}
    message = status.get("message")
    if isinstance(message, Mapping):
        answer["message"] = {
            "kind": "message",
            **{k: v for k, v in message.items() if k not in ("parts", "role")},
            "role": _ROLES.get(str(message.get("role")), "agent"),
            "parts": [_part_out(p) for p in message.get("parts") or []],
        }
    if status.get("timestamp"):
        answer["timestamp"] = status["timestamp"]
    return answer


def _artifact(artifact: Mapping[str, Any]) -> dict[str, Any]:
    return {**artifact, "parts": [_part_out(p) for p in artifact.get("parts") or []]}


def _part_out(part: Mapping[str, Any]) -> dict[str, Any]:
    if "text" in part:
        return {"kind": "text", "text": part["text"]}
    if "data" in part:
        return {"kind": "data", "data": part["data"]}
    return {"kind": "text", "text": protocol.text_of([part])}
