"""The one call point, through the real kubernetes_asyncio client against a tiny server on 127.0.0.1.

Each answer the server gives (or the answer it never gives) must come out of KubeClient as the typed
error, never as ApiException or a bare aiohttp error.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import (
    APIAlreadyExistsError,
    APIForbiddenError,
    APINotFoundError,
    APIServerError,
    APITooManyRequestsError,
    APITransportError,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[[Handler], Awaitable[KubeClient]]


def status_answer(code: int, reason: str, message: str, **headers: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message}
    return web.json_response({**body, "code": code}, status=code, headers=headers)


def kube_for(port: int) -> KubeClient:
    return KubeClient(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")))


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """serve(handler) -> a KubeClient talking to a server that answers every request with handler."""
    runners: list[web.AppRunner] = []
    clients: list[KubeClient] = []

    async def start(handler: Handler) -> KubeClient:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        kube = kube_for(port)
        clients.append(kube)
        return kube

    yield start
    for kube in clients:
        await kube.close()
    for runner in runners:
        await runner.cleanup()


async def test_a_429_comes_out_as_too_many_requests_with_the_servers_retry_after(serve: Serve) -> None:
    async def shed(request: web.Request) -> web.Response:
        return status_answer(
            429, "TooManyRequests", "too many requests, please try again later", **{"Retry-After": "3"}
        )

    kube = await serve(shed)
    with pytest.raises(APITooManyRequestsError) as refused:
        await kube.patch_run_status("ns", "run", {"phase": "Running"})
    assert refused.value.retryable and refused.value.retry_after == 3.0
    assert refused.value.message == "too many requests, please try again later"


async def test_a_missing_secret_reads_as_none_and_a_forbidden_one_raises_forbidden(serve: Serve) -> None:
    async def secrets(request: web.Request) -> web.Response:
        name = request.path.rsplit("/", 1)[-1]
        if name == "present":
            return web.json_response({"kind": "Secret", "data": {"key": base64.b64encode(b"value").decode()}})
        if name == "missing":
            return status_answer(404, "NotFound", 'secrets "missing" not found')
        return status_answer(403, "Forbidden", 'cannot get resource "secrets"')

    kube = await serve(secrets)
    assert await kube.read_secret_key("ns", "present", "key") == "value"
    assert await kube.read_secret_key("ns", "present", "other-key") is None
    assert await kube.read_secret_key("ns", "missing", "key") is None
    with pytest.raises(APIForbiddenError, match='cannot get resource "secrets"'):
        await kube.read_secret_key("ns", "secret-of-others", "key")


async def test_a_taken_name_is_already_exists_and_a_server_failure_is_retryable(serve: Serve) -> None:
    async def create(request: web.Request) -> web.Response:
        if request.path.endswith("/secrets"):
            return status_answer(409, "AlreadyExists", 'secrets "run-transcript-0" already exists')
        return status_answer(503, "ServiceUnavailable", "etcd is unavailable")

    kube = await serve(create)
    body = {"metadata": {"name": "run-transcript-0"}}
    with pytest.raises(APIAlreadyExistsError) as taken:
        await kube.create_object("secret", "ns", body)
    assert not taken.value.retryable
    with pytest.raises(APIServerError) as unavailable:
        await kube.create_object("configmap", "ns", body)
    assert unavailable.value.retryable and unavailable.value.status == 503


async def test_a_deleted_run_is_not_found(serve: Serve) -> None:
    seen: list[dict[str, object]] = []

    async def delete(request: web.Request) -> web.Response:
        seen.append(json.loads(await request.read()))
        return status_answer(404, "NotFound", 'agentruns.agentrun.dev "run" not found')

    kube = await serve(delete)
    with pytest.raises(APINotFoundError):
        await kube.delete_run("ns", "run", "uid-1")
    assert seen == [{"preconditions": {"uid": "uid-1"}, "propagationPolicy": "Background"}]


async def test_a_refused_connection_is_a_transport_error_caused_by_the_clients_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on once this socket is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kube = kube_for(port)
    try:
        with pytest.raises(APITransportError) as refused:
            await kube.get_run("ns", "run")
    finally:
        await kube.close()
    assert refused.value.retryable and refused.value.status is None
    assert isinstance(refused.value.__cause__, OSError)


async def test_a_connection_cut_before_the_answer_is_a_transport_error(serve: Serve) -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        await asyncio.sleep(0)
        return web.Response()

    kube = await serve(cut)
    with pytest.raises(APITransportError) as cut_off:
        await kube.list_objects("secret", "ns", label_selector="a=b")
    assert cut_off.value.retryable


async def test_the_writes_of_every_iteration_carry_credentials_user_agent_content_type_and_body(
    serve: Serve,
) -> None:
    """The transcript chunk, status patch and Event go past the generated API methods: what reaches the
    server must be what those methods would send."""
    seen: list[tuple[str, str, dict[str, str], object]] = []

    async def record(request: web.Request) -> web.Response:
        headers = {
            name: request.headers.get(name, "") for name in ("Authorization", "User-Agent", "Content-Type")
        }
        seen.append((request.method, request.raw_path, headers, json.loads(await request.read())))
        return web.json_response({})

    kube = await serve(record)
    kube.api_client.configuration.api_key["BearerToken"] = "Bearer t0ken"  # as kubeconfig_loading sets it
    kube.api_client.user_agent = "agentrun-test/1"
    await kube.create_object("secret", "team-a", {"metadata": {"name": "run-transcript-0"}})
    await kube.create_object("configmap", "team-a", {"metadata": {"name": "run-transcript-1"}})
    await kube.patch_run_status("team-a", "run.1", {"phase": "Running", "note": "ü"})
    await kube.create_event("team-a", {"reason": "Finished"})
    await kube.patch_event("team-a", "run.17f", {"count": 2})
    json_headers = {
        "Authorization": "Bearer t0ken",
        "User-Agent": "agentrun-test/1",
        "Content-Type": "application/json",
    }
    merge_headers = {**json_headers, "Content-Type": "application/merge-patch+json"}
    assert seen == [
        (
            "POST",
            "/api/v1/namespaces/team-a/secrets",
            json_headers,
            {"metadata": {"name": "run-transcript-0"}},
        ),
        (
            "POST",
            "/api/v1/namespaces/team-a/configmaps",
            json_headers,
            {"metadata": {"name": "run-transcript-1"}},
        ),
        (
            "PATCH",
            "/apis/agentrun.dev/v1alpha1/namespaces/team-a/agentruns/run.1/status",
            merge_headers,
            {"status": {"phase": "Running", "note": "ü"}},
        ),
        ("POST", "/api/v1/namespaces/team-a/events", json_headers, {"reason": "Finished"}),
        ("PATCH", "/api/v1/namespaces/team-a/events/run.17f", merge_headers, {"count": 2}),
    ]


async def test_a_refused_write_of_an_iteration_is_the_typed_error(serve: Serve) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return status_answer(403, "Forbidden", "secrets is forbidden: cannot create")

    kube = await serve(refuse)
    with pytest.raises(APIForbiddenError):
        await kube.create_object("secret", "ns", {"metadata": {"name": "x"}})
    with pytest.raises(APIForbiddenError):
        await kube.patch_run_status("ns", "run", {"phase": "Running"})
