"""The chart's operator, from the built image in a pod of the real node (UID 65532, read-only root),
runs on Amazon Bedrock and Google Vertex AI with credentials from its namespace's Secrets: botocore
signs and google-auth fetches a token from inside the pod, and the chart's providers.* values reach
the SDKs. The fake model on this host checks both sign-ins for real."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import FINISHED, until
from tests.support.node import HOST_ADDRESS, Helm, Release, create_api_key_secret, release_values
from tests.support.quotas import install_quota_crd

API_KEY = "sk-ant-node-secret-0123456789"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    script = Script("[node:cloud]", [Reply([text_block("signed")], usage=ScriptUsage(1000, 100, 0, 0))])
    async with FakeMessagesAPI(scripts=[script], require_api_key=API_KEY).running(host=HOST_ADDRESS) as api:
        yield api


@pytest.fixture
async def release(cluster: TestCluster, helm: Helm, model: FakeMessagesAPI) -> AsyncIterator[Release]:
    await create_api_key_secret(cluster, API_KEY)
    await install_quota_crd(cluster)  # the chart's per-run quota policy takes its parameters from it
    providers = {
        "bedrock": {"region": model.aws.region, "baseURL": model.url},
        "vertex": {
            "region": model.google.region,
            "projectId": model.google.project,
            "baseURL": f"{model.url}/v1",
        },
    }
    chosen = Release(
        cluster,
        helm,
        release_values(cluster, model.url, providers=providers),
        name=f"agentrun-clouds-{secrets.token_hex(3)}",
    )
    try:
        yield chosen
    finally:
        with contextlib.suppress(AssertionError):
            await chosen.uninstall()


async def _secret(cluster: TestCluster, name: str, data: dict[str, str]) -> None:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    await cluster.request(
        "POST", cluster.path("secrets", api="/api/v1"), json={"metadata": {"name": name}, "data": encoded}
    )


@pytest.mark.timeout(300)
async def test_runs_in_the_charts_pod_sign_in_to_bedrock_and_vertex_with_their_namespaces_secrets(
    cluster: TestCluster, release: Release, model: FakeMessagesAPI
) -> None:
    key_id, secret = model.aws.new_key()
    await _secret(cluster, "aws", {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret})
    await _secret(
        cluster, "gcp", {"key.json": json.dumps(model.google.new_service_account(f"{model.url}/token"))}
    )
    await release.install()
    await release.wait_ready(1)
    models = {
        "on-bedrock": {
            "provider": "bedrock",
            "name": "us.anthropic.claude-haiku-4-5-20251001-v1:0",
            "bedrock": {"credentialsSecretRef": {"name": "aws"}},
        },
        "on-vertex": {
            "provider": "vertex",
            "name": "claude-haiku-4-5@20251001",
            "vertex": {"credentialsSecretRef": {"name": "gcp", "key": "key.json"}},
        },
    }
    for name, spec in models.items():
        await cluster.request(
            "POST",
            cluster.runs_path,
            json=agentrun(name, f"[node:cloud] {name}", namespace=cluster.namespace, model=spec),
        )

    statuses: dict[str, dict[str, Any]] = {}

    async def finished() -> bool:
        listed = await cluster.request("GET", cluster.runs_path)
        statuses.update(
            {
                r["metadata"]["name"]: r.get("status", {})
                for r in listed["items"]
                if r["metadata"]["name"] in models
            }
        )
        return len(statuses) == 2 and all(status.get("phase") in FINISHED for status in statuses.values())

    await until(finished, "both runs to finish", 180)
    for name, status in statuses.items():
        assert (status["phase"], status.get("result"), status["usage"]["costUSD"]) == (
            "Succeeded",
            "signed",
            "0.001500",
        ), (name, status, await release.logs())
    assert model.aws.signed_requests == 1
    assert model.google.issued == 1
    assert [r.path.split("/")[-1] for r in model.requests_for("[node:cloud] on-vertex")] == [
        "claude-haiku-4-5@20251001:rawPredict"
    ]
