"""A Messages API failure or answer, translated into the loop's terms exactly once for both clients.

The SDK path (anthropic_calling) and the direct client (direct_calling) meet here: an error status is
one `translate_status` of (status, error type, message, headers, request id) whichever client read it,
and the direct client reads those from the body as the SDK does (`status_error`), so a run fails,
retries and waits the same way over either. Messages never carry the key.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping
from typing import Any

import anthropic
import httpx2

from agentrun import json_text
from agentrun.loop.errors import FatalModelError, ModelCallError, RetryableModelError, RetryClass
from agentrun.loop.protocols import ModelResponse
from agentrun.model.streaming import applied_edits, finished_block, token_usage

CONTEXT_TOO_LONG = re.compile(
    r"prompt is too long|input is too long|context (window|length)|too many tokens", re.I
)
SPEND_LIMIT = re.compile(r"credit balance|spend(ing)? limit|billing|usage limit|payment instrument", re.I)
TIMED_OUT = "the Messages API did not answer in time"
#: Amazon Bedrock's error types (x-amzn-ErrorType on an error status, :exception-type in a stream, where
#: they are spelled in lower camel case), compared in lower case. The ones not listed are fatal.
BEDROCK_RETRIES: Mapping[str, RetryClass] = {
    "throttlingexception": RetryClass.RATE_LIMITED,
    "servicequotaexceededexception": RetryClass.RATE_LIMITED,
    "serviceunavailableexception": RetryClass.OVERLOADED,
    "modelnotreadyexception": RetryClass.OVERLOADED,
    "internalserverexception": RetryClass.SERVER_ERROR,
    "modelstreamerrorexception": RetryClass.SERVER_ERROR,
    "modelerrorexception": RetryClass.SERVER_ERROR,
    "modeltimeoutexception": RetryClass.TIMEOUT,
}
BEDROCK_FATAL: Mapping[str, str] = {
    "accessdeniedexception": "AuthenticationFailed",
    "unrecognizedclientexception": "AuthenticationFailed",
    "resourcenotfoundexception": "ModelNotFound",
}


def timed_out() -> RetryableModelError:
    return RetryableModelError(TIMED_OUT, retry_class=RetryClass.TIMEOUT)


def connection_failed(kind: str) -> RetryableModelError:
    return RetryableModelError(
        f"connection to the Messages API failed: {kind}", retry_class=RetryClass.CONNECTION
    )


def translate(exc: Exception) -> ModelCallError:
    """Map an SDK/transport failure to the loop's error classes."""
    if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
        return timed_out()
    if isinstance(exc, anthropic.APIConnectionError | httpx2.TransportError):
        return connection_failed(type(exc).__name__)
    if isinstance(exc, anthropic.APIStatusError):
        headers = exc.response.headers
        # Bedrock names its error in a header (``ThrottlingException:http://...``), not in the body.
        kind = exc.type or headers.get("x-amzn-errortype", "").partition(":")[0]
        return translate_status(
            exc.status_code,
            str(kind) if kind else "",
            _text(exc.api_message) or _bedrock_message(exc.body) or exc.message,
            headers,
            exc.request_id or headers.get("x-amzn-requestid"),
        )
    if isinstance(exc, anthropic.APIResponseValidationError):
        return FatalModelError(
            f"unexpected response from the Messages API: {exc.message}", reason="ModelError"
        )
    return FatalModelError(f"{type(exc).__name__}: {exc}", reason="ModelError")


def status_error(status: int, body: bytes, charset: str | None, headers: Mapping[str, str]) -> ModelCallError:
    """An error status as the SDK reads it (``_make_status_error_from_response`` and APIStatusError):
    the body as text, decoded as JSON where it is; `error.type` and `error.message` from it, else the
    SDK's own message for the status."""
    try:
        text = body.decode(codecs.lookup(charset).name if charset else "utf-8", errors="replace").strip()
    except LookupError:
        text = body.decode("utf-8", errors="replace").strip()
    parsed: Any = text
    try:
        parsed = json.loads(text)
        message = f"Error code: {status} - {parsed}"
    except (ValueError, RecursionError):  # as the SDK: whatever is not JSON is the message itself
        message = text or f"Error code: {status}"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    api_message = error.get("message") if isinstance(error, dict) else None
    return translate_status(
        status, str(kind) if kind else "", _text(api_message) or message, headers, headers.get("request-id")
    )


def _bedrock_message(body: object) -> str | None:
    """Bedrock's error body is ``{"message": ...}``, without the Messages API's ``error`` object."""
    return _text(body.get("message")) if isinstance(body, dict) else None


def _text(value: object) -> str | None:
    return str(value) if value else None


def translate_status(
    status: int, kind: str, api_message: str, headers: Mapping[str, str], request_id: str | None
) -> ModelCallError:
    """The one mapping of an error status: retried by class (the server's x-should-retry wins), or
    fatal with the reason docs/stop-reasons.md lists."""
    should_retry = headers.get("x-should-retry")
    retry_class = BEDROCK_RETRIES.get(kind.lower()) or _retry_class(status, kind)
    if should_retry == "false":
        retry_class = None
    elif should_retry == "true" and retry_class is None:
        retry_class = RetryClass.SERVER_ERROR
    if retry_class is not None:
        return RetryableModelError(
            f"{kind or 'HTTP ' + str(status)}: {api_message}",
            retry_class=retry_class,
            retry_after=_retry_after(headers),
            status=status,
            request_id=request_id,
        )
    return FatalModelError(
        f"{kind or 'error'}: {api_message}",
        reason=_fatal_reason(status, kind, api_message),
        status=status,
        request_id=request_id,
        context_window_exceeded=status == 400 and bool(CONTEXT_TOO_LONG.search(api_message)),
    )


def _retry_class(status: int, kind: str) -> RetryClass | None:
    if kind == "overloaded_error" or status == 529:
        return RetryClass.OVERLOADED
    if kind == "rate_limit_error" or status == 429:
        return RetryClass.RATE_LIMITED
    if status == 408:
        return RetryClass.TIMEOUT
    if status >= 500 or kind == "api_error" or status == 409:
        return RetryClass.SERVER_ERROR
    return None


def _fatal_reason(status: int, kind: str, api_message: str) -> str:
    if kind.lower() in BEDROCK_FATAL:
        # Bedrock refuses an account that cannot pay (INVALID_PAYMENT_INSTRUMENT) as AccessDenied.
        return "SpendLimitReached" if SPEND_LIMIT.search(api_message) else BEDROCK_FATAL[kind.lower()]
    if status in (401, 403) or kind in ("authentication_error", "permission_error"):
        return "AuthenticationFailed"
    if status == 402 or kind == "billing_error" or SPEND_LIMIT.search(api_message):
        return "SpendLimitReached"
    if status == 413 or kind == "request_too_large":
        return "RequestTooLarge"
    if status == 404 or kind == "not_found_error":
        return "ModelNotFound"
    if status == 429 or kind == "rate_limit_error":
        return "RateLimited"  # only when the server said not to retry (x-should-retry: false)
    if status >= 500:
        return "ModelError"  # likewise: a server error the server itself said not to retry
    return "InvalidModelRequest"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


def response_from_json(body: bytes, request_id: str | None) -> ModelResponse:
    """A whole Message body, from a server that does not stream; read leniently like the SDK does."""
    try:
        data = json_text.decode(body)
    except ValueError as exc:
        raise RetryableModelError(
            "the Messages API sent a body that is not JSON (cut off?)",
            retry_class=RetryClass.CONNECTION,
            request_id=request_id,
        ) from exc
    if (
        not isinstance(data, dict)
        or data.get("type") != "message"
        or not isinstance(data.get("content"), list)
    ):
        raise FatalModelError(
            "unexpected response from the Messages API: not a message",
            reason="ModelError",
            request_id=request_id,
        )
    details = data.get("stop_details")
    content = [finished_block(block) for block in data["content"] if isinstance(block, dict)]
    return ModelResponse(
        content=content,
        stop_reason=data.get("stop_reason") if isinstance(data.get("stop_reason"), str) else None,
        stop_sequence=data.get("stop_sequence") if isinstance(data.get("stop_sequence"), str) else None,
        usage=token_usage(data.get("usage")),
        model=str(data.get("model") or ""),
        request_id=request_id,
        stop_details=details if isinstance(details, dict) else None,
        context_edits=applied_edits(content, data.get("context_management"), data.get("usage")),
    )
