"""`agentrun a2a`'s server in the test's process against the scenario's cluster, and a2a-sdk clients that
present a person's token: what an A2A caller elsewhere would run."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import AgentCard

from agentrun.a2a.serving import A2AConfig, A2AServer, serving
from agentrun.kube import kubeconfig_loading
from tests.support.clusters import TestCluster
from tests.support.kube_requests import until
from tests.support.ports import free_port


@contextlib.asynccontextmanager
async def running_a2a(cluster: TestCluster, **config: object) -> AsyncIterator[str]:
    """The server on a free 127.0.0.1 port, serving the scenario's namespace; yields its root URL."""
    access = await kubeconfig_loading.load(str(cluster.kubeconfig))
    settings = A2AConfig(**{"namespaces": (cluster.namespace,), "poll_seconds": 0.2, **config})  # type: ignore[arg-type]
    async with serving(A2AServer.of(access, settings), "127.0.0.1", 0) as port:
        yield f"http://127.0.0.1:{port}"


def agent_url(root: str, namespace: str, agent: str) -> str:
    return f"{root}/agents/{namespace}/{agent}"


@contextlib.asynccontextmanager
async def sdk_client(
    base_url: str, token: str | None, *, streaming: bool = False
) -> AsyncIterator[tuple[Client, AgentCard]]:
    """The SDK's client for the agent at ``base_url``, its card read by the SDK's resolver."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)
        try:
            yield client, card
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def a2a_process(cluster: TestCluster, log_path: Path) -> AsyncIterator[str]:
    """`agentrun a2a` as a user (or the chart's pod) starts it, as a separate process on a free port;
    yields its root URL once it serves."""
    port = free_port()
    command = [
        sys.executable, "-m", "agentrun.cli.main", "a2a", "--kubeconfig", str(cluster.kubeconfig),
        "--port", str(port), "--namespace", cluster.namespace, "--public-url", "https://agents.example.com",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=asyncio.subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            await until(lambda: _healthy(url), "agentrun a2a to serve", 30, done=bool)
            yield url
        finally:
            process.terminate()
            await process.wait()


async def _healthy(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "/healthz") as answer:
            return answer.status == 200
    except aiohttp.ClientError:
        return False
