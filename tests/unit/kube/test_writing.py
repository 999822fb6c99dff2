"""The writes of every iteration over the lean HTTP/1.1 client (kube/writing.py): what the REST layer
would send, to the same place, over the same TLS, with the same typed failures.

test_calling.py checks their headers and bodies and refusals through KubeClient; test_proxy.py that a
configured proxy still carries them.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APITooManyRequestsError, APITransportError
from tests.support.tls import make_pki

Seen = list[tuple[str, str, tuple[str, int]]]


@pytest.fixture
def recording() -> tuple[web.Application, Seen]:
    seen: Seen = []

    async def record(request: web.Request) -> web.Response:
        await request.read()
        assert request.transport is not None
        seen.append((request.method, request.raw_path, request.transport.get_extra_info("peername")))
        if request.headers.get("X-Refuse"):
            status = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429}
            return web.json_response(status, status=429, headers={"Retry-After": "7"})
        return web.json_response({"kind": "Event"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    return app, seen


async def _serve(app: web.Application, tls: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_writes_keep_the_servers_path_prefix_and_share_one_kept_alive_connection(
    recording: tuple[web.Application, Seen],
) -> None:
    app, seen = recording
    runner, port = await _serve(app)
    kube = KubeClient(
        client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}/k8s/clusters/c-1"))
    )
    try:
        for count in range(3):
            await kube.patch_event("team-a", "run.17f", {"count": count})
    finally:
        await kube.close()
        await runner.cleanup()
    assert [(method, path) for method, path, _ in seen] == [
        ("PATCH", "/k8s/clusters/c-1/api/v1/namespaces/team-a/events/run.17f")
    ] * 3
    assert len({peer for _, _, peer in seen}) == 1


async def test_a_refused_write_carries_the_servers_retry_after(
    recording: tuple[web.Application, Seen],
) -> None:
    app, _ = recording
    runner, port = await _serve(app)
    kube = KubeClient(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")))
    kube.api_client.default_headers["X-Refuse"] = "yes"
    try:
        with pytest.raises(APITooManyRequestsError) as refused:
            await kube.create_event("team-a", {"reason": "Finished"})
    finally:
        await kube.close()
        await runner.cleanup()
    assert (refused.value.status, refused.value.retry_after, refused.value.retryable) == (429, 7.0, True)


@pytest.mark.parametrize("with_client_certificate", [True, False], ids=["client certificate", "none"])
async def test_writes_go_over_tls_with_the_configurations_ca_and_client_certificate(
    recording: tuple[web.Application, Seen], tmp_path: Path, with_client_certificate: bool
) -> None:
    """The server demands a client certificate: without one the handshake fails, as a transport error."""
    pki = make_pki()
    for name, data in {"ca.crt": pki.ca, "client.crt": pki.client_cert, "client.key": pki.client_key}.items():
        (tmp_path / name).write_bytes(data)
    app, seen = recording
    runner, port = await _serve(app, pki.server_context(tmp_path / "server", require_client_certificate=True))
    configuration = client.Configuration(host=f"https://127.0.0.1:{port}")
    configuration.ssl_ca_cert = str(tmp_path / "ca.crt")
    if with_client_certificate:
        configuration.cert_file, configuration.key_file = (
            str(tmp_path / "client.crt"),
            str(tmp_path / "client.key"),
        )
    kube = KubeClient(client.ApiClient(configuration))
    try:
        if with_client_certificate:
            await kube.create_event("team-a", {"reason": "Finished"})
        else:
            with pytest.raises(APITransportError):
                await kube.create_event("team-a", {"reason": "Finished"})
    finally:
        await kube.close()
        await runner.cleanup()
    assert len(seen) == (1 if with_client_certificate else 0)
