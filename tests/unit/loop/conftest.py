"""Every loop scenario of this folder runs through each provider's wire form: Anthropic's Messages API,
Amazon Bedrock's InvokeModel (SigV4, event-stream framing) and Google Vertex AI's rawPredict (an OAuth
token from a service account key), all served by the same scripted fake."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentrun.api.provider_spec import PROVIDERS as ALL_PROVIDERS
from agentrun.api.provider_spec import Provider
from tests.support.loop_harness import PROVIDERS


@pytest.fixture(autouse=True, params=ALL_PROVIDERS)
def provider(request: pytest.FixtureRequest) -> Iterator[Provider]:
    chosen: Provider = request.param
    before, PROVIDERS.current = PROVIDERS.current, chosen
    try:
        yield chosen
    finally:
        PROVIDERS.current = before
