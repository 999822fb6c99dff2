"""Error classes that carry retry behaviour, so one layer (ours) decides what is retried.

The model adapter translates SDK exceptions into these exactly once; the loop never sees an SDK
type. Tools raise ToolError; anything else a tool raises is reported as an internal tool error.
"""

from __future__ import annotations

from enum import StrEnum


class RetryClass(StrEnum):
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    SERVER_ERROR = "server_error"
    CONNECTION = "connection"
    TIMEOUT = "timeout"


class ModelCallError(Exception):
    """Base of every error the model adapter may raise."""

    def __init__(self, message: str, *, status: int | None = None, request_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.request_id = request_id


class RetryableModelError(ModelCallError):
    """Transient: retried with backoff (or the server's retry-after) within the run's deadline."""

    def __init__(
        self,
        message: str,
        *,
        retry_class: RetryClass,
        retry_after: float | None = None,
        status: int | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message, status=status, request_id=request_id)
        self.retry_class = retry_class
        self.retry_after = retry_after


class FatalModelError(ModelCallError):
    """Permanent: retrying cannot help (bad request, auth, spend limit). Ends the run."""

    def __init__(
        self,
        message: str,
        *,
        reason: str = "ModelError",
        status: int | None = None,
        request_id: str | None = None,
        context_window_exceeded: bool = False,
    ) -> None:
        super().__init__(message, status=status, request_id=request_id)
        self.reason = reason
        self.context_window_exceeded = context_window_exceeded


class QuotaRefused(Exception):
    """A model request does not fit a quota even once every outstanding reservation settles: it
    is not sent, and the run ends QuotaExceeded with `message` (naming the quota and the limit)."""

    def __init__(self, message: str, *, condition_reason: str = "QuotaExceeded") -> None:
        super().__init__(message)
        self.message = message
        self.condition_reason = condition_reason


class ToolError(Exception):
    """A failure the model should see as a structured is_error tool result."""

    def __init__(self, code: str, message: str, *, hint: str = "", recoverable: bool = True) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint
        self.recoverable = recoverable

    def as_payload(self) -> dict[str, object]:
        return {
            "error": True,
            "code": self.code,
            "message": self.message,
            "hint": self.hint,
            "recoverable": self.recoverable,
        }


class HandedOff(Exception):
    """The run stopped at a checkpoint because it was asked to yield (another replica takes it over):
    it has not ended, so whoever runs the loop writes no outcome for it."""

    def __init__(self) -> None:
        super().__init__("the run stopped at a checkpoint to be resumed elsewhere")
