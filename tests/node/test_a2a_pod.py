"""The chart's A2A server (a2a.enabled) as users run it: its own pod from the operator's image, in a
namespace that enforces the restricted Pod Security Standard. Its account's one rule (get on Agents)
publishes the card; tasks are runs the chart's operator executes, each created with its caller's token."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block
from tests.support.builders import agent
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.console import READ_RUNS, person
from tests.support.kube_requests import until
from tests.support.node import HOST_ADDRESS, Helm, Release, create_api_key_secret, is_ready, release_values

API_KEY = "sk-ant-node-a2a-0123456789"
CREATE_RUNS = {"apiGroups": ["agentrun.dev"], "resources": ["agentruns"], "verbs": ["create", "get", "list"]}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[Script("[node:a2a]", [Reply([text_block("395")])])], require_api_key=API_KEY
    )
    async with api.running(host=HOST_ADDRESS) as server:
        yield server


@pytest.fixture
async def release(cluster: TestCluster, helm: Helm, model: FakeMessagesAPI) -> AsyncIterator[Release]:
    await create_api_key_secret(cluster, API_KEY)
    values = release_values(cluster, model.url, a2a={"enabled": True, "namespaces": [cluster.namespace]})
    chosen = Release(cluster, helm, values, name=f"agentrun-operator-{secrets.token_hex(3)}")
    try:
        yield chosen
    finally:
        _, listed = await helm.run("list", "--namespace", cluster.namespace, "-q", check=False)
        if chosen.name in listed.split():
            with contextlib.suppress(AssertionError):
                await chosen.uninstall()


def _send(text: str, message_id: str) -> dict[str, Any]:
    message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}


@pytest.mark.timeout(420)
async def test_the_charts_a2a_server_runs_each_task_as_its_caller_from_a_restricted_pod(
    cluster: TestCluster, release: Release, model: FakeMessagesAPI
) -> None:
    await release.install()
    await release.wait_ready(1)
    manifest = agent("answerer", namespace=cluster.namespace, model={"name": "claude-haiku-4-5"})
    manifest["spec"]["a2a"] = {"expose": True, "description": "Answers sums."}
    await cluster.request("POST", f"{RUNS_API}/namespaces/{cluster.namespace}/agents", json=manifest)
    alice = await person(cluster, "alice", [CREATE_RUNS])
    bob = await person(cluster, "bob", [READ_RUNS])
    selector = f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=a2a"

    async def ready_server() -> dict[str, Any] | None:
        pods = (await cluster.request("GET", cluster.path("pods") + f"?labelSelector={selector}"))["items"]
        return next((p for p in pods if is_ready(p)), None)

    pod: Any = await until(ready_server, "the A2A server's pod to be Ready", 180)
    assert pod is not None
    base = f"http://{pod['status']['podIP']}:8091/agents/{cluster.namespace}/answerer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        card = await (await http.get(base + "/.well-known/agent-card.json")).json()
        assert card["description"] == "Answers sums.", card
        refused = await http.post(base, json=_send("[node:a2a] bob", "m-b"), headers=_bearer(bob.token))
        assert refused.status == 403, await refused.text()
        answer = await http.post(base, json=_send("[node:a2a] 17*23+4", "m-a"), headers=_bearer(alice.token))
        task = (await answer.json())["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["artifacts"][0]["parts"][0]["text"] == "395"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
