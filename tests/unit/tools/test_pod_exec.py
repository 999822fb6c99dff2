"""exec_in_pod against a websocket server on 127.0.0.1 speaking the exec channel protocol, and the emulator.

The server plays what a kube-apiserver sends (measured on a real v1.36 server with a real node: an
empty stdout frame first, the output, the Status on channel 3, then the close frame), or refuses the
upgrade with a Status, as the API server does before it reaches a kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import pytest

from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.pod_exec import ExecError, ExecResult, exec_in_pod
from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.local_servers import serving_app
from tests.support.ports import free_port

SUCCESS = {"metadata": {}, "status": "Success"}
SA = "system:serviceaccount:team:sandbox"


def exit_status(code: int) -> dict[str, Any]:
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: command terminated with exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def frame(channel: int, data: bytes | dict[str, Any]) -> bytes:
    payload = json.dumps(data).encode() if isinstance(data, dict) else data
    return bytes([channel]) + payload


@dataclass
class Upgrade:
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]


@dataclass
class ExecEndpoint:
    """Answers every exec upgrade with ``frames`` then a close frame, or refuses it with ``refusal``."""

    frames: list[bytes] = field(default_factory=list)
    refusal: tuple[int, Any] | None = None
    #: Keep the websocket open after the frames (a command that never ends).
    hold: bool = False
    #: Drop the TCP connection after the frames, with no close frame (a broken stream).
    drop: bool = False
    upgrades: list[Upgrade] = field(default_factory=list)
    url: str = ""

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        self.upgrades.append(Upgrade(request.path, list(request.query.items()), dict(request.headers)))
        if self.refusal is not None:
            status, body = self.refusal
            if isinstance(body, str):
                return aiohttp.web.Response(status=status, text=body)
            return aiohttp.web.json_response(body, status=status)
        ws = aiohttp.web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(request)
        for data in self.frames:
            await ws.send_bytes(data)
        if self.hold:
            await asyncio.Event().wait()
        if self.drop:
            assert request.transport is not None
            request.transport.abort()
            return ws
        await ws.close()
        return ws

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ExecEndpoint]:
        app = aiohttp.web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        async with serving_app(app, shutdown_timeout=0.1) as self.url:
            yield self


async def _bearer() -> str:
    return "Bearer operator-token"


async def _no_token() -> None:
    return None


async def run(
    endpoint: ExecEndpoint,
    argv: list[str] | None = None,
    *,
    user: str | None = SA,
    timeout: float = 30,
    output_limit: int = 1_048_576,
) -> ExecResult:
    return await exec_in_pod(
        KubeConnection(endpoint.url, None, _bearer),
        user=user,
        namespace="team",
        pod="sandbox-1",
        container="work",
        argv=argv or ["sh", "-c", "true"],
        timeout=timeout,
        output_limit=output_limit,
    )


async def test_a_command_s_output_and_a_successful_status_make_exit_code_zero() -> None:
    frames = [frame(1, b""), frame(1, b"hello "), frame(1, b"world\n"), frame(3, SUCCESS)]
    async with ExecEndpoint(frames=frames).running() as endpoint:
        result = await run(endpoint)
    assert result == ExecResult(stdout=b"hello world\n", stderr=b"", exit_code=0)


async def test_a_non_zero_exit_code_comes_from_the_status_cause_and_stderr_is_kept_apart() -> None:
    frames = [frame(1, b"out\n"), frame(2, b"err\n"), frame(3, exit_status(3))]
    async with ExecEndpoint(frames=frames).running() as endpoint:
        result = await run(endpoint)
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)


async def test_the_argv_container_and_streams_go_in_the_query_and_no_stdin_is_asked_for() -> None:
    argv = ["sh", "-c", "printf '%s' \"a&b=c d\" # ünïcode"]
    async with ExecEndpoint(frames=[frame(3, SUCCESS)]).running() as endpoint:
        await run(endpoint, argv)
    (upgrade,) = endpoint.upgrades
    assert upgrade.path == "/api/v1/namespaces/team/pods/sandbox-1/exec"
    assert [value for key, value in upgrade.query if key == "command"] == argv
    assert dict(upgrade.query) | {"command": ""} == {
        "command": "",
        "container": "work",
        "stdout": "true",
        "stderr": "true",
    }


async def test_the_operator_s_token_and_the_impersonated_user_are_sent_and_both_protocols_offered() -> None:
    async with ExecEndpoint(frames=[frame(3, SUCCESS)]).running() as endpoint:
        await run(endpoint, user=SA)
        await run(endpoint, user=None)
    as_sa, as_operator = endpoint.upgrades
    assert as_sa.headers["Impersonate-User"] == SA
    assert as_sa.headers["Authorization"] == "Bearer operator-token"
    assert "Impersonate-User" not in as_operator.headers
    offered = [p.strip() for p in as_sa.headers["Sec-WebSocket-Protocol"].split(",")]
    assert offered == ["v5.channel.k8s.io", "v4.channel.k8s.io"]


async def test_output_past_the_limit_is_read_and_dropped_per_stream_and_counted() -> None:
    frames = [
        frame(1, b"0123456"),
        frame(1, b"789abcdef"),
        frame(2, b"xyz"),
        frame(1, b"!"),
        frame(3, SUCCESS),
    ]
    async with ExecEndpoint(frames=frames).running() as endpoint:
        result = await run(endpoint, output_limit=10)
    assert (result.stdout, result.stdout_dropped) == (b"0123456789", 7)
    assert (result.stderr, result.stderr_dropped) == (b"xyz", 0)
    assert result.exit_code == 0


async def test_a_stream_closed_without_a_status_leaves_the_exit_code_unknown() -> None:
    async with ExecEndpoint(frames=[frame(1, b"partial")]).running() as endpoint:
        result = await run(endpoint)
    assert (result.stdout, result.exit_code) == (b"partial", None)


async def test_a_stream_that_breaks_before_its_status_is_unavailable() -> None:
    async with ExecEndpoint(frames=[frame(1, b"partial")], drop=True).running() as endpoint:
        with pytest.raises(ExecError) as caught:
            await run(endpoint)
    assert caught.value.kind == "unavailable"
    assert "sandbox-1" in str(caught.value)


async def test_a_connection_dropped_after_the_status_still_gives_the_exit_code() -> None:
    """A real API server closes the TCP connection right after its close frame; the outcome is known."""
    async with ExecEndpoint(frames=[frame(3, exit_status(137))], drop=True).running() as endpoint:
        result = await run(endpoint)
    assert result.exit_code == 137


async def test_a_command_the_runtime_cannot_start_is_an_exec_failure_with_the_runtime_s_words() -> None:
    failure = {
        "metadata": {},
        "status": "Failure",
        "message": 'Internal error occurred: exec: "nope": executable file not found in $PATH',
    }
    async with ExecEndpoint(frames=[frame(3, failure)]).running() as endpoint:
        with pytest.raises(ExecError) as caught:
            await run(endpoint, ["nope"])
    assert caught.value.kind == "exec_failed"
    assert "executable file not found" in str(caught.value)


async def test_a_command_that_outlives_the_timeout_is_a_timeout() -> None:
    async with ExecEndpoint(frames=[frame(1, b"started")], hold=True).running() as endpoint:
        with pytest.raises(ExecError) as caught:
            await run(endpoint, timeout=0.3)
    assert caught.value.kind == "timeout"
    assert "0.3 s" in str(caught.value)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


NO_HOST = "pod sandbox-1 does not have a host assigned"
NOT_STARTED = 'container not found ("work")'
NO_GET = (
    f'pods "sandbox-1" is forbidden: User "{SA}" cannot get resource "pods/exec" in API group "" '
    'in the namespace "team"'
)
NO_IMPERSONATION = (
    'serviceaccounts "sandbox" is forbidden: User "op" cannot impersonate resource "serviceaccounts" '
    'in API group "" in the namespace "team"'
)
NEEDS = "(exec needs get and create on pods/exec)"


@pytest.mark.parametrize(
    ("status", "body", "kind", "words"),
    [
        (400, _status(400, "BadRequest", NO_HOST), "not_running", NO_HOST),
        (500, _status(500, "InternalError", NOT_STARTED), "not_running", NOT_STARTED),
        (
            400,
            _status(400, "BadRequest", "container work is not valid for pod sandbox-1"),
            "gone",
            "not valid",
        ),
        (404, _status(404, "NotFound", 'pods "sandbox-1" not found'), "gone", 'pods "sandbox-1" not found'),
        (403, _status(403, "Forbidden", NO_GET), "forbidden", f"{NO_GET} {NEEDS}"),
        (
            403,
            _status(403, "Forbidden", 'pods "sandbox-1" is forbidden: '),
            "forbidden",
            f"forbidden {NEEDS}",
        ),
        (403, _status(403, "Forbidden", NO_IMPERSONATION), "impersonation_denied", NO_IMPERSONATION),
        (401, _status(401, "Unauthorized", "Unauthorized"), "unauthorized", "rejected"),
        (503, "upstream connect error", "unavailable", "(HTTP 503): upstream connect error"),
    ],
)
async def test_a_refused_upgrade_is_an_error_of_its_kind_with_the_api_server_s_message(
    status: int, body: Any, kind: str, words: str
) -> None:
    async with ExecEndpoint(refusal=(status, body)).running() as endpoint:
        with pytest.raises(ExecError) as caught:
            await run(endpoint)
    assert caught.value.kind == kind
    assert words in str(caught.value)


async def test_an_api_server_that_cannot_be_reached_is_unavailable() -> None:
    connection = KubeConnection(f"http://127.0.0.1:{free_port()}", None, _no_token)
    with pytest.raises(ExecError) as caught:
        await exec_in_pod(
            connection, user=None, namespace="team", pod="p", container="c", argv=["true"], timeout=10
        )
    assert caught.value.kind == "unavailable"


async def test_the_emulator_refuses_exec_as_a_real_api_server_does_without_a_node() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sandbox-1"},
           "spec": {"containers": [{"name": "work", "image": "busybox"}]}}  # fmt: skip
    grant = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "exec"},
        "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "exec"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec"},
        "subjects": [{"kind": "ServiceAccount", "name": "sandbox", "namespace": "default"}],
    }
    async with EmulatedCluster.running() as kube, KubeClient(kube.url) as admin:
        kube.emulator.authorize_impersonated_users = True
        assert (await admin.post("/api/v1/namespaces/default/pods", pod)).status == 201
        connection = KubeConnection(kube.url, None, _no_token)

        async def kind_of(user: str | None, pod: str = "sandbox-1") -> tuple[str, str]:
            with pytest.raises(ExecError) as caught:
                await exec_in_pod(
                    connection, user=user, namespace="default", pod=pod, container="work", argv=["true"],
                    timeout=10,
                )  # fmt: skip
            return caught.value.kind, str(caught.value)

        sandbox = "system:serviceaccount:default:sandbox"
        kind, message = await kind_of(None)
        assert (kind, "pod sandbox-1 does not have a host assigned" in message) == ("not_running", True)
        assert (await kind_of(None, "gone-1"))[0] == "gone"
        assert (await kind_of(sandbox))[0] == "forbidden"
        assert (
            await admin.post("/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", grant)
        ).status == 201
        path = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings"
        assert (await admin.post(path, binding)).status == 201
        assert (await kind_of(sandbox))[0] == "not_running"
