"""Fault injection for the emulated API server: error answers, slow answers and dropped watch streams.

Faults are checked before the request touches any state, so an injected 409 on a status patch means the
patch did not happen, exactly as when a real server refuses it. Each rule matches on any combination of
HTTP method, path (exact string or a regular expression that must match the whole path), Kubernetes verb,
resource, subresource, namespace and name, and fires ``times`` times (``None``: forever).

Examples::

    emulator.faults.add(method="PATCH", path=re.compile(r".*/status$"), status=409, times=2)
    emulator.faults.add(verb="create", resource="agentruns", status=429, retry_after=1)
    emulator.faults.add(verb="get", delay=0.5, status=None)        # slow but successful
    emulator.faults.drop_watch(resource="agentruns", after_events=3)  # stream ends after 3 events
    emulator.faults.drop_watch(resource="agentruns", after_seconds=1, expire=True)  # then a 410 ERROR event
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrun_sandbox.kube.http import RequestRecord

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_MESSAGES = {
    409: "Operation cannot be fulfilled: the object has been modified; please apply your changes to the "
    "latest version and try again",
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected fault",
    503: "the server is currently unable to handle the request",
}


def default_reason(status: int) -> str:
    return _REASONS.get(status, "InternalError" if status >= 500 else "BadRequest")


@dataclass
class _Match:
    method: str | None = None
    path: str | re.Pattern[str] | None = None
    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None

    def matches(self, record: RequestRecord) -> bool:
        if self.method is not None and record.method.upper() != self.method.upper():
            return False
        if isinstance(self.path, re.Pattern):
            if self.path.fullmatch(record.path) is None:
                return False
        elif self.path is not None and record.path != self.path:
            return False
        if self.verb is not None and record.verb != self.verb.lower():
            return False
        if self.resource is not None:
            group, _, plural = self.resource.rpartition("/")
            if plural != record.resource or (group and group != record.group):
                return False
        if self.subresource is not None and record.subresource != self.subresource:
            return False
        if self.namespace is not None and record.namespace != self.namespace:
            return False
        return self.name is None or record.name == self.name


@dataclass
class Fault(_Match):
    """An error (or delay) answered instead of serving the request. ``status=None`` only delays."""

    status: int | None = 500
    reason: str | None = None
    message: str | None = None
    retry_after: float | None = None
    delay: float = 0.0
    times: int | None = 1
    hits: int = 0

    def status_body(self) -> dict[str, Any]:
        assert self.status is not None
        details: dict[str, Any] = {}
        if self.retry_after is not None:
            details["retryAfterSeconds"] = max(1, int(self.retry_after))
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message or _MESSAGES.get(self.status, f"injected fault: HTTP {self.status}"),
            "reason": self.reason or default_reason(self.status),
            "details": details,
            "code": self.status,
        }


@dataclass
class WatchDrop(_Match):
    """Ends a watch stream after ``after_events`` events or ``after_seconds`` seconds, whichever is first.

    With ``expire=True`` the stream ends with an ERROR event carrying a 410 Expired status, as a real
    server does when the client's resourceVersion is compacted; without it the connection just closes.
    """

    after_events: int | None = None
    after_seconds: float | None = None
    expire: bool = False
    times: int | None = 1
    hits: int = 0


@dataclass
class Faults:
    """The active rules of one emulator, consulted in the order they were added."""

    rules: list[Fault | WatchDrop] = field(default_factory=list)

    def add(
        self,
        *,
        method: str | None = None,
        path: str | re.Pattern[str] | None = None,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        status: int | None = 500,
        reason: str | None = None,
        message: str | None = None,
        retry_after: float | None = None,
        delay: float = 0.0,
        times: int | None = 1,
    ) -> Fault:
        if status == 429 and retry_after is None:
            retry_after = 1
        fault = Fault(
            method=method,
            path=path,
            verb=verb,
            resource=resource,
            subresource=subresource,
            namespace=namespace,
            name=name,
            status=status,
            reason=reason,
            message=message,
            retry_after=retry_after,
            delay=delay,
            times=times,
        )
        self.rules.append(fault)
        return fault

    def drop_watch(
        self,
        *,
        path: str | re.Pattern[str] | None = None,
        resource: str | None = None,
        namespace: str | None = None,
        after_events: int | None = None,
        after_seconds: float | None = None,
        expire: bool = False,
        times: int | None = 1,
    ) -> WatchDrop:
        if after_events is None and after_seconds is None:
            raise ValueError("drop_watch() needs after_events or after_seconds")
        drop = WatchDrop(
            path=path,
            resource=resource,
            namespace=namespace,
            verb="watch",
            after_events=after_events,
            after_seconds=after_seconds,
            expire=expire,
            times=times,
        )
        self.rules.append(drop)
        return drop

    def clear(self) -> None:
        self.rules.clear()

    def _take(self, record: RequestRecord, kind: type[Fault] | type[WatchDrop]) -> Fault | WatchDrop | None:
        for rule in self.rules:
            if not isinstance(rule, kind) or not rule.matches(record):
                continue
            if rule.times is not None and rule.hits >= rule.times:
                continue
            rule.hits += 1
            return rule
        return None

    def take_fault(self, record: RequestRecord) -> Fault | None:
        rule = self._take(record, Fault)
        return rule if isinstance(rule, Fault) else None

    def take_watch_drop(self, record: RequestRecord) -> WatchDrop | None:
        rule = self._take(record, WatchDrop)
        return rule if isinstance(rule, WatchDrop) else None
