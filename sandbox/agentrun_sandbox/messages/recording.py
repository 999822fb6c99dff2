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
SECRET_HEADERS = frozenset(
    {"x-api-key", "authorization", "proxy-authorization", "cookie", "set-cookie", "x-amz-security-token"}
)
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


_COUNTED = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


@dataclass(frozen=True)
class Bill:
    """One answer the server generated, with the tokens it would be billed for.

    Billed when the answer is generated, whether or not the client is still there to read it: the API
    does the work either way. A quota check compares what the operator counted with these.
    """

    request_id: str
    user_id: str | None
    """``metadata.user_id`` of the request (the operator sends the run's uid)."""
    model: str
    usage: Mapping[str, Any]

    @property
    def total(self) -> int:
        """Input, output and cache tokens, plus a server-side compaction's (reported in ``iterations``)."""
        counted = sum(int(self.usage.get(key) or 0) for key in _COUNTED)
        for entry in self.usage.get("iterations") or ():
            if isinstance(entry, Mapping) and entry.get("type") == "compaction":
                counted += sum(int(entry.get(key) or 0) for key in _COUNTED)
        return counted


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
