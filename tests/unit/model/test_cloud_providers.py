"""Bedrock and Vertex AI through the real SDK clients, against the fake's doors that check each cloud's
sign-in for real (SigV4 recomputed with botocore, service account assertions verified with google-auth)
and answer in each cloud's wire form. The loop's scenarios run through both doors too
(tests/unit/loop/conftest.py); these are what only a cloud has."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from agentrun.api.stops import StopReason
from agentrun.loop.config import context_window_of
from agentrun.loop.errors import FatalModelError, RetryableModelError, RetryClass
from agentrun.loop.protocols import ModelRequest
from agentrun.model.access import AwsKeys, ModelAccess
from agentrun.model.anthropic_calling import AnthropicModel, ClientPool, needs_streaming
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, StreamError, text_block
from tests.support.loop_harness import access_to, run_scripted

BEDROCK_ID = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
VERTEX_ID = "claude-haiku-4-5@20251001"


@pytest.fixture
async def api() -> AsyncIterator[FakeMessagesAPI]:
    script = Script("[cloud]", [Reply([text_block("hello")], usage=ScriptUsage(1000, 100, 0, 0))])
    async with FakeMessagesAPI([script], demo_brain=False).running() as server:
        yield server


@pytest.fixture
async def pool() -> AsyncIterator[ClientPool]:
    clients = ClientPool(timeout_seconds=30, shards=1)
    yield clients
    await clients.close()


def _request(model: str, *, max_tokens: int = 200) -> ModelRequest:
    return ModelRequest(
        model=model, max_tokens=max_tokens, messages=[{"role": "user", "content": "[cloud] hi"}]
    )


@pytest.mark.parametrize("max_tokens", [200, 64_000], ids=["invoke", "response stream"])
async def test_a_bedrock_request_is_signed_with_sigv4_for_its_region_and_read_in_either_form(
    api: FakeMessagesAPI, pool: ClientPool, max_tokens: int
) -> None:
    answer = await pool.model(access_to(api, "bedrock")).complete(_request(BEDROCK_ID, max_tokens=max_tokens))
    assert answer.content == [{"type": "text", "text": "hello"}]
    assert answer.request_id is not None and answer.request_id.startswith("req_")  # from x-amzn-RequestId
    sent = api.requests[-1]
    suffix = "invoke" if max_tokens == 200 else "invoke-with-response-stream"
    assert sent.path == f"/model/{BEDROCK_ID}/{suffix}"
    assert sent.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIA")
    assert "/us-east-1/bedrock/aws4_request" in sent.headers["authorization"]
    assert api.aws.signed_requests == 1


async def test_a_bedrock_request_signed_with_the_wrong_secret_ends_authentication_failed_unretried(
    api: FakeMessagesAPI, pool: ClientPool
) -> None:
    key_id, _ = api.aws.new_key()
    wrong = ModelAccess(
        "bedrock", base_url=api.url, region="us-east-1", aws_keys=AwsKeys(key_id, "not-the-secret")
    )
    with pytest.raises(FatalModelError) as refused:
        await pool.model(wrong).complete(_request(BEDROCK_ID))
    assert refused.value.reason == "AuthenticationFailed"
    assert "signature we calculated does not match" in str(refused.value)


async def test_a_bedrock_request_signed_for_another_region_is_refused(
    api: FakeMessagesAPI, pool: ClientPool
) -> None:
    access = dataclasses.replace(access_to(api, "bedrock"), region="eu-west-1")
    with pytest.raises(FatalModelError) as refused:
        await pool.model(access).complete(_request(BEDROCK_ID))
    assert "eu-west-1/bedrock is not us-east-1/bedrock" in str(refused.value)


async def test_a_bedrock_api_key_is_sent_as_a_bearer_token(api: FakeMessagesAPI, pool: ClientPool) -> None:
    api.aws.api_keys.add("bedrock-api-key-0123")
    access = ModelAccess("bedrock", base_url=api.url, region="us-east-1", api_key="bedrock-api-key-0123")
    answer = await pool.model(access).complete(_request(BEDROCK_ID))
    assert answer.content == [{"type": "text", "text": "hello"}]
    assert api.requests[-1].headers["authorization"] == "Bearer bedrock-api-key-0123"


async def test_a_throttling_exception_inside_a_bedrock_stream_is_retried_as_rate_limited(
    api: FakeMessagesAPI, pool: ClientPool
) -> None:
    api.add_script(Script("[throttled]", [StreamError(error_type="rate_limit_error", message="slow down")]))
    model = pool.model(access_to(api, "bedrock"))
    assert isinstance(model, AnthropicModel)
    request = dataclasses.replace(_request(BEDROCK_ID), messages=[{"role": "user", "content": "[throttled]"}])
    with pytest.raises(RetryableModelError) as failed:
        await AnthropicModel(model.client, always_stream=True).complete(request)
    assert failed.value.retry_class is RetryClass.RATE_LIMITED
    assert str(failed.value) == "throttlingException: slow down"


async def test_a_vertex_request_carries_a_token_the_service_account_key_obtained(
    api: FakeMessagesAPI, pool: ClientPool
) -> None:
    model = pool.model(access_to(api, "vertex"))
    for _ in range(2):
        answer = await model.complete(_request(VERTEX_ID))
        assert answer.content == [{"type": "text", "text": "hello"}]
    assert api.google.issued == 1  # one token, kept until it expires
    assert api.requests[-1].path == (
        f"/v1/projects/agentrun-test/locations/us-east5/publishers/anthropic/models/{VERTEX_ID}:rawPredict"
    )


async def test_a_vertex_key_the_token_endpoint_refuses_ends_authentication_failed(
    api: FakeMessagesAPI, pool: ClientPool
) -> None:
    # The same account's name, another key: what a deleted or forged key looks like to Google.
    stranger = FakeMessagesAPI().google.new_service_account(f"{api.url}/token")
    access = dataclasses.replace(access_to(api, "vertex"), google_credentials=stranger)
    with pytest.raises(FatalModelError) as refused:
        await pool.model(access).complete(_request(VERTEX_ID))
    assert refused.value.reason == "AuthenticationFailed"
    assert "Google sign-in refused" in str(refused.value)
    assert "Could not verify token signature" in str(refused.value)
    assert api.requests == []


async def test_a_vertex_token_endpoint_that_cannot_be_reached_is_retried_like_a_dropped_connection(
    api: FakeMessagesAPI, pool: ClientPool
) -> None:
    unreachable = api.google.new_service_account("http://127.0.0.1:9/token")
    access = dataclasses.replace(access_to(api, "vertex"), google_credentials=unreachable)
    with pytest.raises(RetryableModelError) as failed:
        await pool.model(access).complete(_request(VERTEX_ID))
    assert failed.value.retry_class is RetryClass.CONNECTION


async def test_a_vertex_project_the_token_has_no_rights_in_is_refused_as_vertex_refuses_it(
    api: FakeMessagesAPI, pool: ClientPool
) -> None:
    access = dataclasses.replace(access_to(api, "vertex"), project_id="someone-elses")
    with pytest.raises(FatalModelError) as refused:
        await pool.model(access).complete(_request(VERTEX_ID))
    assert refused.value.reason == "AuthenticationFailed"
    assert "Permission denied on projects/someone-elses/locations/us-east5" in str(refused.value)


@pytest.mark.parametrize(("provider", "model"), [("bedrock", BEDROCK_ID), ("vertex", VERTEX_ID)])
async def test_a_cloud_model_id_is_priced_and_windowed_as_the_claude_model_it_names(
    provider: str, model: str
) -> None:
    run = await run_scripted(
        [Reply([text_block("done")], usage=ScriptUsage(1_000_000, 100_000, 0, 0))],
        spec={"model": {"name": model}},
        provider="bedrock" if provider == "bedrock" else "vertex",
    )
    assert run.outcome.stop_reason is StopReason.END_TURN
    assert run.finished.progress.cost_usd == Decimal("1.5")  # claude-haiku-4-5: $1 in, $5 out
    assert context_window_of(model) == context_window_of("claude-haiku-4-5") is not None


@pytest.mark.parametrize("model", ["us.anthropic.claude-opus-4-20250514-v1:0", "claude-opus-4@20250514"])
def test_a_cloud_id_is_streamed_above_the_non_streaming_limit_of_the_claude_model_it_names(
    model: str,
) -> None:
    assert not needs_streaming(model, 8192)
    assert needs_streaming(model, 8193)
