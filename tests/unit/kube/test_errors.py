"""Every failure of a Kubernetes call becomes one typed error that says whether and when to retry."""

from __future__ import annotations

import json
import ssl

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.kube.errors import (
    APIAlreadyExistsError,
    APIClientError,
    APIConflictError,
    APIError,
    APIForbiddenError,
    APIGoneError,
    APIInvalidError,
    APINotFoundError,
    APIServerError,
    APIStatusError,
    APITooManyRequestsError,
    APITransportError,
    APIUnauthorizedError,
    translated,
)


def api_exception(status: int, reason: str, message: str, **details: object) -> ApiException:
    """What kubernetes_asyncio raises on the parsed path: the server's Status as the raw body."""
    error = ApiException(status=status, reason="HTTP reason phrase")
    status_body = {
        "kind": "Status",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": status,
    }
    if details:
        status_body["details"] = details
    error.body = json.dumps(status_body).encode()
    return error


@pytest.mark.parametrize(
    ("status", "reason", "kind", "retryable"),
    [
        (400, "BadRequest", APIInvalidError, False),
        (401, "Unauthorized", APIUnauthorizedError, False),
        (403, "Forbidden", APIForbiddenError, False),
        (404, "NotFound", APINotFoundError, False),
        (409, "Conflict", APIConflictError, True),
        (409, "AlreadyExists", APIAlreadyExistsError, False),
        (410, "Gone", APIGoneError, False),
        (418, "Teapot", APIClientError, False),
        (422, "Invalid", APIInvalidError, False),
        (429, "TooManyRequests", APITooManyRequestsError, True),
        (500, "InternalError", APIServerError, True),
        (503, "ServiceUnavailable", APIServerError, True),
        (504, "Timeout", APIServerError, True),
    ],
)
def test_each_status_class_becomes_its_typed_error_and_says_whether_a_retry_can_help(
    status: int, reason: str, kind: type[APIError], retryable: bool
) -> None:
    error = translated(api_exception(status, reason, f"the server says {status}"))
    assert type(error) is kind and isinstance(error, APIStatusError), "the server answered"
    assert error.retryable is retryable
    assert (error.status, error.reason, error.message) == (status, reason, f"the server says {status}")
    assert error.retry_after is None
    assert str(error) == f"HTTP {status} {reason}: the server says {status}"


def test_a_429_carries_the_servers_retry_after_from_the_header_or_else_from_the_status_details() -> None:
    from_header = api_exception(429, "TooManyRequests", "slow down")
    from_header.headers = {"Retry-After": "7"}
    error = translated(from_header)
    assert isinstance(error, APITooManyRequestsError) and error.retry_after == 7.0

    from_details = translated(api_exception(429, "TooManyRequests", "slow down", retryAfterSeconds=3))
    assert from_details is not None and from_details.retry_after == 3.0


def test_an_answer_without_a_status_body_keeps_the_http_reason_and_a_409_without_one_is_a_conflict() -> None:
    bare = ApiException(status=409, reason="Conflict")
    error = translated(bare)
    assert type(error) is APIConflictError and error.retryable
    assert error.message == "Conflict" and error.body == b""
    garbled = ApiException(status=500, reason="Internal Server Error")
    garbled.body = b"<html>proxy error</html>"
    server = translated(garbled)
    assert isinstance(server, APIServerError) and server.message == "Internal Server Error"


@pytest.mark.parametrize(
    "failure",
    [
        ConnectionRefusedError(111, "Connection refused"),
        ConnectionResetError(104, "Connection reset by peer"),
        ssl.SSLError(1, "CERTIFICATE_VERIFY_FAILED"),
        TimeoutError(),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("Response payload is not completed"),
    ],
    ids=["refused", "reset", "tls", "timeout", "disconnected", "cut-body"],
)
def test_a_call_that_got_no_answer_is_a_retryable_transport_error(failure: BaseException) -> None:
    error = translated(failure)
    assert isinstance(error, APITransportError) and not isinstance(error, APIStatusError)
    assert error.retryable and error.status is None and error.retry_after is None
    assert str(error)  # never an empty message in a log line


def test_a_bug_is_not_translated_and_a_typed_error_is_translated_to_itself() -> None:
    assert translated(KeyError("status")) is None
    assert translated(ValueError("bad")) is None
    typed = APINotFoundError("gone", status=404, reason="NotFound")
    assert translated(typed) is typed
