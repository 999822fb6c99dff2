"""Runs on Amazon Bedrock and Google Vertex AI, through the operator, with each way of signing in:
a Secret in the run's namespace, and the operator pod's own cloud identity (IRSA's web identity
exchanged at STS; a service account key file as Application Default Credentials). The fake's doors
check the signatures and tokens for real; the API server is the emulator or a real kube-apiserver.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, request, wait_finished, wait_status
from tests.support.operator_process import OperatorProcess

BEDROCK_ID = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
VERTEX_ID = "claude-haiku-4-5@20251001"
ROLE = "arn:aws:iam::123456789012:role/agentrun-operator"
PROJECTED_TOKEN = "eyJhbGciOiJSUzI1NiJ9.projected-service-account-token"
WAIT = 60.0

SCRIPTS = [
    Script(
        "[clouds]",
        [
            Reply(
                [tool_use_block("calculator", {"expression": "6*7"})],
                stop_reason="tool_use",
                usage=ScriptUsage(1000, 100, 0, 0),
            ),
            Reply([text_block("42")], usage=ScriptUsage(1000, 100, 0, 0)),
        ],
    )
]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    async with FakeMessagesAPI(scripts=SCRIPTS, demo_brain=False).running() as server:
        server.aws.web_identities[ROLE] = PROJECTED_TOKEN
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    """The operator as IRSA and a mounted Google key file leave it: a role and a projected token, a
    credentials file, and the endpoints (STS, Bedrock, Vertex AI) pointed at the fake."""
    token = tmp_path / "token"
    token.write_text(PROJECTED_TOKEN)
    adc = tmp_path / "application_default_credentials.json"
    adc.write_text(json.dumps(model.google.new_service_account(f"{model.url}/token", name="operator")))
    nothing = tmp_path / "no-aws-config"
    env = {
        "AWS_ROLE_ARN": ROLE,
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
        "AWS_ENDPOINT_URL_STS": f"{model.url}/sts/",
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(nothing),
        "AWS_SHARED_CREDENTIALS_FILE": str(nothing),
        "AWS_EC2_METADATA_DISABLED": "true",
        "ANTHROPIC_BEDROCK_BASE_URL": model.url,
        "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
        "CLOUD_ML_REGION": model.google.region,
        "ANTHROPIC_VERTEX_PROJECT_ID": model.google.project,
        "ANTHROPIC_VERTEX_BASE_URL": f"{model.url}/v1",
    }
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


async def _secret(cluster: TestCluster, name: str, data: dict[str, str]) -> None:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    body = {"metadata": {"name": name}, "data": encoded}
    await request(cluster, "POST", f"/api/v1/namespaces/{cluster.namespace}/secrets", json=body)


async def _run(cluster: TestCluster, name: str, model: dict[str, Any]) -> dict[str, Any]:
    tools = [{"builtin": {"name": "calculator"}}]
    manifest = agentrun(name, f"[clouds] {name}", namespace=cluster.namespace, model=model, tools=tools)
    await request(cluster, "POST", cluster.runs_path, json=manifest)
    status: dict[str, Any] = (await wait_finished(cluster, name, timeout=WAIT))["status"]
    return status


def _succeeded_at_claude_prices(status: dict[str, Any]) -> None:
    assert (status["phase"], status["result"]) == ("Succeeded", "42"), status.get("message")
    assert (
        status["usage"]["costUSD"] == "0.003000"
    )  # 2 × (1000 × $1 + 100 × $5) per million: claude-haiku-4-5


async def test_a_bedrock_run_signs_with_the_keys_in_its_secret(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    key_id, secret = model.aws.new_key()
    await _secret(cluster, "aws", {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret})
    bedrock = {"region": "us-east-1", "credentialsSecretRef": {"name": "aws"}}
    status = await _run(
        cluster, "keys", {"provider": "bedrock", "name": BEDROCK_ID, "baseURL": model.url, "bedrock": bedrock}
    )
    _succeeded_at_claude_prices(status)
    sent = model.requests_for("[clouds] keys")
    assert [r.path for r in sent] == [f"/model/{BEDROCK_ID}/invoke"] * 2
    assert all(f"Credential={key_id}/" in r.headers["authorization"] for r in sent)


async def test_a_bedrock_run_without_a_secret_signs_as_the_operators_irsa_role(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    status = await _run(cluster, "irsa", {"provider": "bedrock", "name": BEDROCK_ID})
    _succeeded_at_claude_prices(status)
    sent = model.requests_for("[clouds] irsa")
    assert len(sent) == 2
    # Temporary keys STS issued for the projected token, with their session token.
    assert all(
        "Credential=ASIA" in r.headers["authorization"] and r.headers["x-amz-security-token"] for r in sent
    )


async def test_a_vertex_run_signs_in_with_the_service_account_key_in_its_secret(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    key = model.google.new_service_account(f"{model.url}/token", name="team-a")
    await _secret(cluster, "gcp", {"key.json": json.dumps(key)})
    vertex = {"region": model.google.region, "credentialsSecretRef": {"name": "gcp", "key": "key.json"}}
    status = await _run(
        cluster,
        "sa-key",
        {"provider": "vertex", "name": VERTEX_ID, "baseURL": f"{model.url}/v1", "vertex": vertex},
    )
    _succeeded_at_claude_prices(status)
    sent = model.requests_for("[clouds] sa-key")
    assert [r.path.rsplit("/", 1)[1] for r in sent] == [f"{VERTEX_ID}:rawPredict"] * 2
    assert all(r.headers["authorization"].startswith("Bearer ya29.") for r in sent)


async def test_a_vertex_run_without_a_secret_uses_the_operators_application_default_credentials(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    status = await _run(cluster, "adc", {"provider": "vertex", "name": VERTEX_ID})
    _succeeded_at_claude_prices(status)
    assert len(model.requests_for("[clouds] adc")) == 2


async def test_a_secret_holding_half_a_key_pair_keeps_the_run_pending_until_it_is_whole(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    key_id, secret = model.aws.new_key()
    await _secret(cluster, "half", {"AWS_ACCESS_KEY_ID": key_id})
    bedrock = {"region": "us-east-1", "credentialsSecretRef": {"name": "half"}}
    spec = {"provider": "bedrock", "name": BEDROCK_ID, "baseURL": model.url, "bedrock": bedrock}
    manifest = agentrun(
        "half",
        "[clouds] half",
        namespace=cluster.namespace,
        model=spec,
        tools=[{"builtin": {"name": "calculator"}}],
    )
    await request(cluster, "POST", cluster.runs_path, json=manifest)
    status = await wait_status(cluster, "half", phase_in("Pending"))
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["reason"] == "SecretInvalid"
    assert status["message"] == (
        f"Secret {cluster.namespace}/half (spec.model.bedrock.credentialsSecretRef) has AWS_ACCESS_KEY_ID "
        "but no AWS_SECRET_ACCESS_KEY; the run starts once it has both"
    )
    assert model.requests_for("[clouds] half") == []
    patch = {"data": {"AWS_SECRET_ACCESS_KEY": base64.b64encode(secret.encode()).decode()}}
    await request(
        cluster,
        "PATCH",
        f"/api/v1/namespaces/{cluster.namespace}/secrets/half",
        json=patch,
        headers={"Content-Type": "application/merge-patch+json"},
    )
    _succeeded_at_claude_prices((await wait_finished(cluster, "half", timeout=WAIT))["status"])
