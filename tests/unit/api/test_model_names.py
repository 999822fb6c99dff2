"""A provider's model ID is read back to the Claude model it names, for prices and context windows."""

from __future__ import annotations

import pytest

from agentrun.api.model_names import claude_model


@pytest.mark.parametrize(
    ("given", "claude"),
    [
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5-20250929"),
        ("us.anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5-20251001"),
        ("global.anthropic.claude-sonnet-4-6", "claude-sonnet-4-6"),
        ("us-gov.anthropic.claude-3-7-sonnet-20250219-v1:0", "claude-3-7-sonnet-20250219"),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.anthropic.claude-opus-4-1-20250805-v1:0",
            "claude-opus-4-1-20250805",
        ),
        (
            "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-5-haiku-20241022-v1:0",
            "claude-3-5-haiku-20241022",
        ),
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5-20250929"),
        ("claude-opus-4-6@latest", "claude-opus-4-6"),
        ("claude-haiku-4-5", "claude-haiku-4-5"),
    ],
)
def test_bedrock_and_vertex_ids_name_their_claude_model(given: str, claude: str) -> None:
    assert claude_model(given) == claude


@pytest.mark.parametrize(
    "given",
    [
        "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3",
        "gateway/some-model",
        "amazon.titan-text-express-v1",
        "anthropic.",
    ],
)
def test_an_id_that_names_no_claude_model_is_left_as_it_is(given: str) -> None:
    assert claude_model(given) == given
