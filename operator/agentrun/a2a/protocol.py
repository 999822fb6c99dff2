"""The A2A 1.0 wire format both sides of the operator speak: JSON-RPC method names, error codes, task
states and message parts, as the protocol's JSON mapping spells them (camelCase, enum names).

Pure data and functions: the server (serving.py) and the A2A tool (tools/a2a_calling.py) build and read
every message through here, so the two cannot drift apart, and the a2a-sdk tests pin both to the SDK.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION = "1.0"
VERSION_HEADER = "A2A-Version"
CARD_PATH = "/.well-known/agent-card.json"
BINDING = "JSONRPC"

SEND = "SendMessage"
STREAM = "SendStreamingMessage"
GET_TASK = "GetTask"
CANCEL_TASK = "CancelTask"

# JSON-RPC 2.0's own codes, then A2A's (section "Error Handling" of the specification).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
TASK_NOT_CANCELABLE = -32002
UNSUPPORTED_OPERATION = -32004
CONTENT_TYPE_NOT_SUPPORTED = -32005
VERSION_NOT_SUPPORTED = -32009

SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
COMPLETED = "TASK_STATE_COMPLETED"
FAILED = "TASK_STATE_FAILED"
CANCELED = "TASK_STATE_CANCELED"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
REJECTED = "TASK_STATE_REJECTED"
AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"
#: States after which a task never changes again.
TERMINAL = frozenset({COMPLETED, FAILED, CANCELED, REJECTED})
#: States in which the task waits for its caller: a blocking send answers then, as at the end.
INTERRUPTED = frozenset({INPUT_REQUIRED, AUTH_REQUIRED})

ROLE_USER = "ROLE_USER"
ROLE_AGENT = "ROLE_AGENT"


@dataclass(frozen=True)
class RPCError(Exception):
    """A JSON-RPC error the server answers with, or the client was answered with."""

    code: int
    message: str
    data: Any = None

    def __str__(self) -> str:
        return f"{self.message} (JSON-RPC error {self.code})"

    def body(self, request_id: Any) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": request_id, "error": error}


def result(request_id: Any, value: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": dict(value)}


def request(request_id: str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": dict(params)}


def text_message(text: str, *, message_id: str, role: str = ROLE_USER, **ids: str) -> dict[str, Any]:
    """A message of one text part; ``ids``: contextId and taskId when the message belongs to a task."""
    return {"messageId": message_id, "role": role, "parts": [{"text": text}], **ids}


def text_of(parts: Any) -> str:
    """The text a list of parts carries: text parts as they are, data parts as JSON, files named."""
    texts: list[str] = []
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, Mapping):
            continue
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif "data" in part:
            texts.append(json.dumps(part["data"]))
        elif isinstance(part.get("url"), str):
            texts.append(f"[file {part.get('filename') or part['url']}, {part.get('mediaType', '')}]")
        elif "raw" in part:
            texts.append(
                f"[file {part.get('filename') or '(unnamed)'}, {part.get('mediaType', '')}, not shown]"
            )
    return "\n".join(texts)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def task_text(task: Mapping[str, Any]) -> str:
    """What a task answered: its artifacts' parts, else the text of its status message."""
    artifacts = task.get("artifacts")
    listed = artifacts if isinstance(artifacts, list) else []
    text = "\n".join(text_of(_mapping(a).get("parts")) for a in listed)
    if text.strip():
        return text
    return status_text(task)


def status_text(task: Mapping[str, Any]) -> str:
    return text_of(_mapping(_mapping(task.get("status")).get("message")).get("parts"))


def state_of(task: Mapping[str, Any]) -> str:
    state = _mapping(task.get("status")).get("state")
    return state if isinstance(state, str) else ""
