"""The three wire forms of one Messages API answer: Anthropic's, Amazon Bedrock's and Google Vertex AI's.

The answer (message JSON, stream events, faults) is planned once; only its envelope differs:

* Anthropic: errors as ``{"type": "error", "error": {...}}``, streams as server-sent events.
* Bedrock (InvokeModel / InvokeModelWithResponseStream): errors as ``{"message": ...}`` with their type
  in ``x-amzn-ErrorType`` and Bedrock's own statuses (no 529: overload is a 503
  ServiceUnavailableException); streams in AWS event-stream framing (binary messages with headers and
  two CRC32s), each event a ``chunk`` whose payload carries the event JSON base64-encoded under
  ``bytes``; an error in a stream is an ``exception`` message named by ``:exception-type``.
* Vertex AI (rawPredict / streamRawPredict): streams and model errors as Anthropic's, but Google's own
  front end answers quota, sign-in and permission errors in Google's shape
  (``{"error": {"code", "message", "status"}}``).
"""

from __future__ import annotations

import base64
import json
import secrets
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from agentrun_sandbox.messages.wire import Event, error_body, sse

DialectName = Literal["anthropic", "bedrock", "vertex"]

#: Anthropic's error types as Bedrock names and numbers them (status, x-amzn-ErrorType).
BEDROCK_ERRORS: Mapping[str, tuple[int, str]] = {
    "invalid_request_error": (400, "ValidationException"),
    "request_too_large": (413, "ValidationException"),
    "billing_error": (403, "AccessDeniedException"),
    "authentication_error": (403, "UnrecognizedClientException"),
    "permission_error": (403, "AccessDeniedException"),
    "not_found_error": (404, "ResourceNotFoundException"),
    "rate_limit_error": (429, "ThrottlingException"),
    "overloaded_error": (503, "ServiceUnavailableException"),
    "api_error": (500, "InternalServerException"),
    "timeout_error": (408, "ModelTimeoutException"),
}
#: ...and inside a response stream, where the exception types are spelled in lower camel case.
BEDROCK_STREAM_ERRORS: Mapping[str, str] = {
    "rate_limit_error": "throttlingException",
    "overloaded_error": "serviceUnavailableException",
    "api_error": "internalServerException",
    "invalid_request_error": "validationException",
}
BEDROCK_STREAM_ERROR = "modelStreamErrorException"
#: Statuses Google's front end answers itself on Vertex AI, with their gRPC status names.
GOOGLE_STATUSES: Mapping[int, str] = {
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    429: "RESOURCE_EXHAUSTED",
}


@dataclass(frozen=True)
class Dialect:
    name: DialectName

    @property
    def stream_content_type(self) -> str:
        if self.name == "bedrock":
            return "application/vnd.amazon.eventstream"
        return "text/event-stream; charset=utf-8"

    def id_headers(self, request_id: str) -> dict[str, str]:
        if self.name == "bedrock":
            return {"x-amzn-RequestId": request_id}
        return {"request-id": request_id}

    def error(
        self,
        status: int,
        error_type: str,
        message: str,
        request_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        """An error status in this provider's body shape (``status`` is Anthropic's, mapped here)."""
        extra = {**self.id_headers(request_id), **(headers or {})}
        if self.name == "bedrock":
            status, kind = BEDROCK_ERRORS.get(
                error_type, (status if status != 529 else 503, "InternalServerException")
            )
            extra["x-amzn-ErrorType"] = f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
            return web.json_response({"message": message}, status=status, headers=extra)
        if self.name == "vertex" and status in GOOGLE_STATUSES:
            body = {"error": {"code": status, "message": message, "status": GOOGLE_STATUSES[status]}}
            return web.json_response(body, status=status, headers=extra)
        return web.json_response(error_body(error_type, message, request_id), status=status, headers=extra)

    def encode(self, event: Event) -> bytes:
        """One stream event on the wire; an ``error`` event is an exception message on Bedrock."""
        if self.name != "bedrock":
            return sse(event)
        name, data = event
        if name == "error":
            found = data.get("error")
            error: dict[str, Any] = found if isinstance(found, dict) else {}
            kind = BEDROCK_STREAM_ERRORS.get(str(error.get("type")), BEDROCK_STREAM_ERROR)
            payload = json.dumps({"message": str(error.get("message", ""))}).encode()
            return event_stream_message(
                {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"},
                payload,
            )
        raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        # Bedrock pads each chunk ("p") so its size says nothing about the text it carries.
        chunk = {"bytes": base64.b64encode(raw).decode(), "p": secrets.token_hex(4)}
        return event_stream_message(
            {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"},
            json.dumps(chunk).encode(),
        )


ANTHROPIC = Dialect("anthropic")
BEDROCK = Dialect("bedrock")
VERTEX = Dialect("vertex")

_STRING_HEADER = 7


def event_stream_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One message of the AWS event-stream encoding: total and headers length, the prelude's CRC32,
    string headers, the payload, and the whole message's CRC32 (what botocore's EventStreamBuffer
    checks)."""
    encoded = b"".join(
        bytes([len(name)])
        + name.encode()
        + bytes([_STRING_HEADER])
        + struct.pack(">H", len(value))
        + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))
