"""One line for the user when the Kubernetes API cannot be used: what failed, what the server said, what next.

Every command that talks to a cluster (`agentrun operator`, the demo, `agentrun run`, the kubectl
plugin) reports through :func:`explain`, so a 403 or a refused connection reads the same everywhere
and no command shows a traceback for a cluster that is down, a credential that expired or a missing CRD.
Call sites only say what they were doing (:func:`explained`); the wording lives here.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
from collections.abc import Iterator
from typing import Protocol

import aiohttp

from agentrun.kube.errors import APIError, APITransportError

__all__ = ["KubeFailure", "KubeconfigError", "Source", "explain", "explained"]

SERVER_MESSAGE_LIMIT = 500


class KubeFailure(Exception):
    """A failure worded for the user, one line: the command prints it and exits non-zero."""


class KubeconfigError(KubeFailure):
    """The cluster configuration cannot be used (missing file, unknown context, failing exec plugin)."""


class Source(Protocol):
    """Where the failing client was sent, for the advice (kube/kubeconfig_loading.ClusterAccess)."""

    @property
    def server(self) -> str: ...

    @property
    def source(self) -> str: ...


def explain(
    exc: BaseException,
    action: str,
    subject: str,
    *,
    access: Source | None = None,
    missing: str | None = None,
    invalid: str | None = None,
) -> str | None:
    """``cannot <action> <subject>: <problem>; <next step>``, or None for an error that is not the cluster's.

    ``missing`` replaces "<subject> not found" on a 404 (e.g. "the CRD is not installed ..."),
    ``invalid`` is the next step after a 400/422. Causes are followed, so Kopf's LoginError explains
    the 401 behind it.
    """
    for cause in _causes(exc):
        if isinstance(cause, KubeFailure):
            return str(cause)
        if isinstance(cause, APITransportError) and cause.__cause__ is None:
            return (
                f"cannot {action} {subject}: cannot reach the Kubernetes API at {_server(cause, access)} "
                f"({cause.message}); check that the cluster is running and that {_source(access)} "
                "points at it"
            )
        # Our typed APIError, or Kopf's own (its login and startup checks): both carry the HTTP status.
        status = getattr(cause, "status", None)
        if isinstance(status, int) and 400 <= status <= 599:
            return _refused(cause, status, action, subject, access, missing, invalid)
        if isinstance(cause, aiohttp.ClientSSLError | ssl.SSLError):
            return (
                f"cannot {action} {subject}: TLS with {_server(cause, access)} failed ({_reason(cause)}); "
                f"check certificate-authority and the client certificate in {_source(access)}"
            )
        if isinstance(cause, TimeoutError):
            return (
                f"cannot {action} {subject}: the Kubernetes API at {_server(cause, access)} did not answer "
                "in time; check that the cluster is up, then retry"
            )
        if isinstance(cause, aiohttp.ClientConnectionError | ConnectionError | OSError):
            return (
                f"cannot {action} {subject}: cannot reach the Kubernetes API at {_server(cause, access)} "
                f"({_reason(cause)}); check that the cluster is running and that {_source(access)} "
                "points at it"
            )
    return None


@contextlib.contextmanager
def explained(
    action: str,
    subject: str,
    *,
    access: Source | None = None,
    missing: str | None = None,
    invalid: str | None = None,
) -> Iterator[None]:
    """Turns the block's cluster failures into :class:`KubeFailure`; anything else (a bug) passes as is."""
    try:
        yield
    except KubeFailure:
        raise
    except Exception as exc:
        message = explain(exc, action, subject, access=access, missing=missing, invalid=invalid)
        if message is None:
            raise
        raise KubeFailure(message) from exc


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _refused(
    exc: BaseException,
    status: int,
    action: str,
    subject: str,
    access: Source | None,
    missing: str | None,
    invalid: str | None,
) -> str:
    said = _server_message(exc)
    answer = f"HTTP {status}: {said}" if said else f"HTTP {status}"
    if status == 404:
        return f"cannot {action} {subject}: {missing}" if missing else f"{subject} not found"
    if status == 401:
        return (
            f"cannot {action} {subject}: the API server at {_server(exc, access)} did not accept the "
            f"credentials of {_source(access)} ({answer}); log in again or renew the token, then retry"
        )
    if status == 403:
        return (
            f"cannot {action} {subject}: forbidden ({answer}); grant this identity the RBAC permission "
            "the message names, or use another context"
        )
    if status == 409:
        return f"cannot {action} {subject}: conflict ({answer}); retry"
    if status in (400, 422):
        step = invalid or "fix what the message names"
        return f"cannot {action} {subject}: the API server refused it ({answer}); {step}"
    if status == 429 or status >= 500:
        return f"cannot {action} {subject}: the API server is unavailable ({answer}); retry in a moment"
    return f"cannot {action} {subject}: {answer}"


def _server_message(exc: BaseException) -> str:
    """The Status message of the server's answer, on one line and bounded."""
    message = exc.message if isinstance(exc, APIError) else ""  # ours: the Status message, parsed once
    body = getattr(exc, "body", None)  # anyone else's: the raw Status, if any
    if not message and body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(body).get("message") or "")
    if not message and exc.args and isinstance(exc.args[0], str):  # Kopf's APIError: the message
        message = exc.args[0]
    if not message:
        message = str(getattr(exc, "reason", None) or getattr(exc, "message", None) or "")
    message = " ".join(message.split())
    if len(message) > SERVER_MESSAGE_LIMIT:
        message = message[: SERVER_MESSAGE_LIMIT - 1] + "…"
    return message


def _server(exc: BaseException, access: Source | None) -> str:
    if access is not None:
        return access.server
    host = getattr(exc, "host", None)  # aiohttp's connection errors know where they went
    port = getattr(exc, "port", None)
    return f"{host}:{port}" if host else "the configured server"


def _source(access: Source | None) -> str:
    return access.source if access is not None else "the kubeconfig"


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "os_error", None) or getattr(exc, "certificate_error", None) or exc
    errno = getattr(inner, "errno", None)
    if isinstance(errno, int) and errno > 0 and not isinstance(inner, ssl.SSLError):
        return os.strerror(errno)
    text = getattr(inner, "verify_message", None) or getattr(inner, "reason", None) or str(inner)
    return " ".join(str(text).split()) or type(inner).__name__
