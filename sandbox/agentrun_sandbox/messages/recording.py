"""The log of requests the fake Messages API received: what tests assert on after a run.

Kept apart from the server so a test helper can type against :class:`RecordedRequest` and read the log
without the HTTP machinery; secrets stay in the log (tests check auth) and leave it only redacted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from agentrun_sandbox.messages.protocol import first_user_text

#: Header names whose values :meth:`RecordedRequest.redacted` hides.
SECRET_HEADERS = frozenset({"x-api-key", "authorization", "proxy-authorization", "cookie", "set-cookie"})
REDACTED = "<redacted>"


@dataclass(frozen=True)
class RecordedRequest:
    """One request as it arrived, with what the server decided to do about it."""

    arrived_at: float
    """Wall-clock arrival time (``time.time()``)."""
    method: str
    path: str
    headers: Mapping[str, str]
    """Lower-cased names; secrets are kept so tests can check auth (see :meth:`redacted`)."""
    body: Any
    """The parsed JSON body, or ``None`` when it was not JSON."""
    request_id: str
    script: str | None
    """Key of the script that answered, ``None`` for the demo brain and for rejected requests."""
    step: int | None
    """Step index (assistant messages in the request) for answered requests."""
    outcome: str
    """``reply``, ``demo_brain``, a fault kind (e.g. ``http_error``), ``invalid_request``, ``unauthorized``,
    ``count_tokens`` or ``not_found``."""

    @property
    def model(self) -> str | None:
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def first_user_text(self) -> str:
        return first_user_text(self.body) if isinstance(self.body, dict) else ""

    def redacted(self) -> RecordedRequest:
        """A copy safe to print or attach to a failure report."""
        headers = {
            name: REDACTED if name in SECRET_HEADERS else value for name, value in self.headers.items()
        }
        return replace(self, headers=headers)


class RequestLog:
    """The most recent requests (all of them unless bounded, so a long benchmark does not grow forever)."""

    def __init__(self, maxlen: int | None = None) -> None:
        self._requests: deque[RecordedRequest] = deque(maxlen=maxlen)

    def __iter__(self) -> Iterator[RecordedRequest]:
        return iter(self._requests)

    def record(
        self,
        request: web.Request,
        request_id: str,
        body: Any,
        outcome: str,
        *,
        script: str | None = None,
        step: int | None = None,
    ) -> None:
        self._requests.append(
            RecordedRequest(
                arrived_at=time.time(),
                method=request.method,
                path=request.path,
                headers={name.lower(): value for name, value in request.headers.items()},
                body=body,
                request_id=request_id,
                script=script,
                step=step,
                outcome=outcome,
            )
        )

    def clear(self) -> None:
        self._requests.clear()
