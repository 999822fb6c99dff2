"""What went wrong with a Kubernetes API call, as one typed error that says whether and when to retry.

Why typed: every caller used to read ``ApiException.status`` and decide for itself what a transient
failure is, and they disagreed. The answer now lives on the error (:attr:`APIError.retryable`,
:attr:`APIError.retry_after`), decided once, where the call is made (kube/calling.py), so callers
catch what they expect (``except APINotFoundError``) and leave the rest to the one retry policy
(kube/retrying.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

__all__ = [
    "APIAlreadyExistsError",
    "APIClientError",
    "APIConflictError",
    "APIError",
    "APIForbiddenError",
    "APIGoneError",
    "APIInvalidError",
    "APINotFoundError",
    "APIServerError",
    "APIStatusError",
    "APITooManyRequestsError",
    "APITransportError",
    "APIUnauthorizedError",
    "refused",
    "translated",
    "typed_errors",
]


class APIError(Exception):
    """A call the API server refused or that never got an answer.

    ``status`` is the HTTP status (None when no answer came), ``reason`` the Status reason
    (``NotFound``, ``AlreadyExists``, ...), ``message`` the server's Status message, ``body`` the raw
    answer, ``retry_after`` the seconds the server asked us to wait (Retry-After or
    ``details.retryAfterSeconds``), or None.
    """

    #: Whether sending the same request again may succeed: each subclass says so for its status.
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str | None = None,
        body: bytes = b"",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.body = body
        self.retry_after = retry_after

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        answer = f"HTTP {self.status} {self.reason}" if self.reason else f"HTTP {self.status}"
        return f"{answer}: {self.message}"


class APIStatusError(APIError):
    """The server answered, with a failure status (as opposed to no answer: :class:`APITransportError`)."""


class APIClientError(APIStatusError):
    """4xx: the request itself is wrong for the server as it is now; the same request fails again."""


class APIServerError(APIStatusError):
    """5xx: the server (or what stands before it) failed; it may work a moment later."""

    retryable = True


class APIUnauthorizedError(APIClientError):
    """401: the credentials are not accepted (expired token, wrong certificate)."""


class APIForbiddenError(APIClientError):
    """403: authenticated, but RBAC or an admission policy says no."""


class APINotFoundError(APIClientError):
    """404: the object (or its kind: a CRD not installed) is not there."""


class APIConflictError(APIClientError):
    """409 Conflict: the object changed under a write; sending the write again is the documented answer."""

    retryable = True


class APIAlreadyExistsError(APIConflictError):
    """409 AlreadyExists: a create of a name that is taken; creating it again cannot help."""

    retryable = False


class APIGoneError(APIClientError):
    """410: the object or the resource version asked for is gone for good."""


class APIInvalidError(APIClientError):
    """400 or 422: the server refused the content (schema, CEL, a failed JSON-patch test)."""


class APITooManyRequestsError(APIClientError):
    """429: the server sheds load (API priority and fairness); it says when to come back."""

    retryable = True


class APITransportError(APIError):
    """No answer: connection refused or reset, TLS failed, the server did not answer in time."""

    retryable = True


_BY_STATUS: Mapping[int, type[APIStatusError]] = {
    400: APIInvalidError,
    401: APIUnauthorizedError,
    403: APIForbiddenError,
    404: APINotFoundError,
    409: APIConflictError,
    410: APIGoneError,
    422: APIInvalidError,
    429: APITooManyRequestsError,
}


def refused(
    status: int, reason: str | None, body: bytes | str | None, headers: Mapping[str, str] | None
) -> APIStatusError:
    """The typed error of an answer outside 2xx, its message and reason taken from the server's Status."""
    raw = body.encode() if isinstance(body, str) else (body or b"")
    document = _status_document(raw)
    reason = str(document.get("reason") or reason or "") or None
    message = " ".join(str(document.get("message") or reason or f"HTTP {status}").split())
    kind: type[APIStatusError]
    if status == 409 and reason == "AlreadyExists":
        kind = APIAlreadyExistsError
    elif status in _BY_STATUS:
        kind = _BY_STATUS[status]
    elif status >= 500:
        kind = APIServerError
    elif status >= 400:
        kind = APIClientError
    else:
        kind = APIStatusError
    retry_after = _retry_after(headers, document)
    return kind(message, status=status, reason=reason, body=raw, retry_after=retry_after)


def translated(exc: BaseException) -> APIError | None:
    """The typed error for a client's failure, or None when ``exc`` is no API failure (a bug: let it out)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ApiException):
        return refused(exc.status or 0, exc.reason, exc.body, exc.headers)
    if isinstance(exc, aiohttp.ClientResponseError):
        return refused(exc.status, exc.message, None, exc.headers)
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        # OSError includes ConnectionError and ssl.SSLError; TimeoutError is asyncio's too.
        return APITransportError(" ".join(str(exc).split()) or type(exc).__name__)
    return None


@contextlib.contextmanager
def typed_errors() -> Iterator[None]:
    """Within it, a client's failure is raised as its typed APIError (the original as its cause);
    any other exception, and an APIError already, goes out as it is."""
    try:
        yield
    except Exception as exc:
        error = translated(exc)
        if error is None or error is exc:
            raise
        raise error from exc


def _status_document(body: bytes) -> dict[str, Any]:
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        document = json.loads(body) if body else {}
        if isinstance(document, dict):
            return document
    return {}


def _retry_after(headers: Mapping[str, str] | None, document: Mapping[str, Any]) -> float | None:
    """Retry-After in seconds (the header, else the Status details); the HTTP-date form is not used by k8s."""
    header = (headers or {}).get("Retry-After")
    details = document.get("details")
    candidates = [header, details.get("retryAfterSeconds") if isinstance(details, dict) else None]
    for value in candidates:
        with contextlib.suppress(TypeError, ValueError):
            if value is not None and float(value) >= 0:
                return float(value)
    return None
