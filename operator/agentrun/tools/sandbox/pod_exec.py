"""Running one command in a container through the Kubernetes exec API, over a websocket.

Why exec and not an in-pod server: the API server authorises every call against the run's
ServiceAccount (impersonation), so RBAC decides who may run commands in which sandbox, and the pod
needs no listening port, token or agent binary of ours. Why aiohttp's websocket and not the
Kubernetes client's stream helper: aiohttp already carries the operator's other API calls, the
protocol is four channels on one websocket, and the failed handshake's Status body (which says why)
must be read, which the client helper hides.

The protocol (``v5.channel.k8s.io`` / ``v4.channel.k8s.io``): every binary message starts with a
channel byte, 1 stdout, 2 stderr, 3 the final ``Status`` (exit code), then the server closes.
The user needs ``get`` and ``create`` on ``pods/exec`` (v1.36 checks both for the websocket's GET).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from agentrun.tools.body_reading import read_capped
from agentrun.tools.environment import KubeConnection

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDOUT, STDERR, STATUS = 1, 2, 3
MAX_ERROR_BODY = 65_536
_NOT_RUNNING = ("does not have a host assigned", "container not found", "not running")


@dataclass(frozen=True)
class ExecResult:
    """What one command left behind; ``*_dropped`` count the bytes read past ``output_limit``."""

    stdout: bytes
    stderr: bytes
    exit_code: int | None  # None: the stream ended without a Status (the outcome is unknown)
    stdout_dropped: int = 0
    stderr_dropped: int = 0


class ExecError(Exception):
    """Why a command could not be run (or its end not seen), as a kind callers switch on.

    kind: ``gone`` (pod or container not found), ``not_running`` (pod not running or not on a
    node yet), ``forbidden`` (RBAC of the impersonated user), ``impersonation_denied``,
    ``unauthorized``, ``unavailable`` (API server unreachable, the websocket broke, any other
    HTTP answer), ``timeout``, ``exec_failed`` (the runtime could not start the command: the
    binary is missing, the container is stopping; the message says which).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __repr__(self) -> str:
        return f"ExecError({self.kind!r}, {self.message!r})"


@dataclass
class _Output:
    """One stream kept up to a limit; the rest is read (so the command is not blocked) and counted."""

    limit: int
    kept: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def add(self, data: bytes) -> None:
        room = max(0, self.limit - len(self.kept))
        self.kept += data[:room]
        self.dropped += max(0, len(data) - room)


def exec_path(namespace: str, pod: str, container: str, argv: Sequence[str]) -> str:
    """The exec URL's path and query: one ``command`` parameter per argument, stdout and stderr only."""
    query: list[tuple[str, str]] = [("command", arg) for arg in argv]
    query += [("container", container), ("stdout", "true"), ("stderr", "true")]
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec?" + urlencode(
        query, quote_via=quote
    )


async def exec_in_pod(
    connection: KubeConnection,
    *,
    user: str | None,
    namespace: str,
    pod: str,
    container: str,
    argv: Sequence[str],
    timeout: float,
    output_limit: int = 1_048_576,
) -> ExecResult:
    """Run ``argv`` in ``container`` and wait for its exit, at most ``timeout`` seconds in all.

    No stdin: callers pass data in ``argv``. On timeout the websocket is closed, which does not kill
    the process in the container (the API server has no such call): callers that need it killed
    wrap ``argv`` in a command that enforces its own deadline.
    """
    if not argv:
        raise ValueError("exec_in_pod needs a command")
    headers = await connection.headers(user)
    url = connection.url(exec_path(namespace, pod, container, argv))
    refused: dict[str, bytes] = {}
    target = f"{namespace}/{pod} ({container})"
    try:
        async with (
            asyncio.timeout(timeout),
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=connection.ssl_context or False),
                timeout=aiohttp.ClientTimeout(total=None),  # the deadline above is the only one
                trace_configs=[_refusal_reader(refused)],
            ) as session,
            session.ws_connect(url, protocols=PROTOCOLS, headers=headers) as ws,
        ):
            return await _read(ws, output_limit, target)
    except TimeoutError:
        raise ExecError("timeout", f"the command in {target} did not finish within {timeout:g} s") from None
    except aiohttp.WSServerHandshakeError as exc:
        raise _refusal(exc.status, refused.get("body", b""), user, target) from None
    except aiohttp.ClientError as exc:
        raise ExecError(
            "unavailable", f"cannot reach the Kubernetes API to exec in {target} ({type(exc).__name__})"
        ) from None


def _refusal_reader(refused: dict[str, bytes]) -> aiohttp.TraceConfig:
    """Keep the body of a refused upgrade: aiohttp raises without it, and the Status inside says why."""

    async def on_request_end(
        session: aiohttp.ClientSession, context: SimpleNamespace, params: aiohttp.TraceRequestEndParams
    ) -> None:
        if params.response.status != 101:
            refused["body"] = await read_capped(params.response.content, MAX_ERROR_BODY)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_request_end)
    return trace


async def _read(ws: aiohttp.ClientWebSocketResponse, output_limit: int, target: str) -> ExecResult:
    """Collect the channels until the server's close frame.

    Once the Status has come, the outcome is known: a real API server drops the TCP connection right
    after its close frame, so aiohttp's answering close fails (a reset) and is no news. Without a
    Status, a close frame ends the stream with the outcome unknown, anything else is a broken stream.
    """
    stdout, stderr = _Output(output_limit), _Output(output_limit)
    status: dict[str, Any] | None = None
    while True:
        message = await ws.receive()
        if message.type is aiohttp.WSMsgType.BINARY and message.data:
            channel, data = message.data[0], message.data[1:]
            if channel == STDOUT:
                stdout.add(data)
            elif channel == STDERR:
                stderr.add(data)
            elif channel == STATUS and data:
                status = _parse_status(data, target)
        elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING):
            break
        elif message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            if status is None:
                broke = ws.exception() or message.data
                raise ExecError("unavailable", f"the exec stream of {target} broke ({type(broke).__name__})")
            break
    return ExecResult(
        stdout=bytes(stdout.kept),
        stderr=bytes(stderr.kept),
        exit_code=None if status is None else _exit_code(status, target),
        stdout_dropped=stdout.dropped,
        stderr_dropped=stderr.dropped,
    )


def _parse_status(data: bytes, target: str) -> dict[str, Any]:
    try:
        status = json.loads(data)
    except ValueError:
        raise ExecError("unavailable", f"the exec stream of {target} ended with a non-JSON status") from None
    if not isinstance(status, dict):
        raise ExecError("unavailable", f"the exec stream of {target} ended with a malformed status")
    return status


def _exit_code(status: dict[str, Any], target: str) -> int:
    """``Success`` is 0; ``NonZeroExitCode`` carries the code as the message of an ``ExitCode`` cause."""
    if status.get("status") == "Success":
        return 0
    message = str(status.get("message") or "the command could not be run")
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or ():
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                try:
                    return int(str(cause.get("message")))
                except ValueError:
                    break
    raise ExecError("exec_failed", f"exec in {target} failed: {message}")


def _refusal(status: int, body: bytes, user: str | None, target: str) -> ExecError:
    """An HTTP answer to the upgrade, by the Status the API server sent (its message is kept).

    A real v1.36 server checks ``get`` on ``pods/exec`` for the websocket's GET, then ``create``;
    a missing ``create`` is refused with an empty reason, so the message says what is needed.
    """
    message = _status_message(body) or f"HTTP {status}"
    who = user or "the operator"
    if status == 403 and "impersonate" in message:
        return ExecError("impersonation_denied", f"the operator may not act as {who}: {message}")
    if status == 403:
        reason = message.rstrip(": ")  # a refused create has no reason: `pods "x" is forbidden: `
        return ExecError(
            "forbidden", f"{who} may not exec in {target}: {reason} (exec needs get and create on pods/exec)"
        )
    if status == 401:
        return ExecError("unauthorized", f"the operator's Kubernetes credentials were rejected: {message}")
    if status == 404:
        return ExecError("gone", f"{target} is gone: {message}")
    if status == 400 and "is not valid for pod" in message:
        return ExecError("gone", f"{target} has no such container: {message}")
    if any(words in message for words in _NOT_RUNNING):  # 400 from the API server, 500 from the kubelet
        return ExecError("not_running", f"{target} is not running: {message}")
    return ExecError("unavailable", f"the Kubernetes API refused exec in {target} (HTTP {status}): {message}")


def _status_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(parsed, dict) and parsed.get("message"):
        return str(parsed["message"])
    return text[:300]
