"""The API client's proxy is resolved once, when the client is built, as aiohttp would per request.

The client's session no longer trusts the environment (a thread hand-off per request to look up
proxies and ~/.netrc), so these check that HTTPS_PROXY/HTTP_PROXY, NO_PROXY and a kubeconfig's
proxy-url still decide where requests go.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from agentrun.kube import kubeconfig_loading
from agentrun.kube.calling import KubeClient
from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kubeconfigs import write_kubeconfig

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY")


class ForwardProxy:
    """Records the request targets a client sends it and answers every one with an empty list."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        self.proxy_authorizations: list[str | None] = []
        self.url = ""

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.targets.append(request.raw_path)
        self.proxy_authorizations.append(request.headers.get("Proxy-Authorization"))
        return web.json_response({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "items": []})


@pytest.fixture
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("NETRC", "/dev/null")
    return monkeypatch


@pytest.fixture
async def proxy() -> AsyncIterator[ForwardProxy]:
    recording = ForwardProxy()
    runner = web.ServerRunner(web.Server(recording.handle))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    recording.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield recording
    finally:
        await runner.cleanup()


@pytest.fixture
async def cluster() -> AsyncIterator[EmulatedCluster]:
    async with EmulatedCluster.running() as running:
        yield running


async def _list_leases(kubeconfig: Path) -> list[dict[str, object]]:
    access = await kubeconfig_loading.load(str(kubeconfig))
    kube = KubeClient(access.api_client())
    try:
        return await kube.list_leases("default", label_selector="a=b")
    finally:
        await kube.close()


async def test_a_proxy_from_the_environment_carries_every_request_even_when_the_variable_changes_later(
    no_proxy_environment: pytest.MonkeyPatch, proxy: ForwardProxy, cluster: EmulatedCluster
) -> None:
    no_proxy_environment.setenv("HTTP_PROXY", proxy.url.replace("http://", "http://user:secret@"))
    access = await kubeconfig_loading.load(str(cluster.kubeconfig_path))
    kube = KubeClient(access.api_client())
    try:
        await kube.list_leases("default", label_selector="a=b")
        no_proxy_environment.delenv("HTTP_PROXY")  # resolved once, when the client was built
        await kube.list_leases("default", label_selector="a=b")
        await kube.create_event("default", {"reason": "Proxied"})  # the writes of every iteration too
    finally:
        await kube.close()
    leases = f"{cluster.url}/apis/coordination.k8s.io/v1/namespaces/default/leases?labelSelector=a%3Db"
    assert proxy.targets == [leases, leases, f"{cluster.url}/api/v1/namespaces/default/events"]
    assert proxy.proxy_authorizations == ["Basic dXNlcjpzZWNyZXQ="] * 3


async def test_no_proxy_sends_requests_straight_to_the_api_server(
    no_proxy_environment: pytest.MonkeyPatch, proxy: ForwardProxy, cluster: EmulatedCluster
) -> None:
    no_proxy_environment.setenv("HTTP_PROXY", proxy.url)
    no_proxy_environment.setenv("NO_PROXY", "127.0.0.1")
    assert await _list_leases(cluster.kubeconfig_path) == []
    assert proxy.targets == []
    assert cluster.emulator.request_log


async def test_a_kubeconfig_proxy_url_wins_over_the_environment(
    no_proxy_environment: pytest.MonkeyPatch, proxy: ForwardProxy, cluster: EmulatedCluster, tmp_path: Path
) -> None:
    no_proxy_environment.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig",
        server=cluster.url,
        cluster={"proxy-url": proxy.url},
        user={"token": cluster.token},
    )
    await _list_leases(kubeconfig)
    assert len(proxy.targets) == 1 and proxy.targets[0].startswith(cluster.url)


def test_the_environment_proxy_honours_no_proxy(no_proxy_environment: pytest.MonkeyPatch) -> None:
    no_proxy_environment.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    no_proxy_environment.setenv("NO_PROXY", ".internal")
    assert kubeconfig_loading.environment_proxy("https://api.example:6443") == "http://proxy.example:3128"
    assert kubeconfig_loading.environment_proxy("https://kube.internal:6443") is None
    assert kubeconfig_loading.environment_proxy("http://api.example:8080") is None
