"""Which model a run calls and how: maxTokens, temperature, extended thinking, the API key."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, JsonValue, model_validator

from agentrun.api.provider_spec import PROVIDER_RULES, BedrockSpec, Provider, VertexSpec
from agentrun.api.spec_base import SecretKeyRef, SpecModel

#: The smallest thinking budget the Messages API accepts.
MIN_THINKING_BUDGET = 1024
DEFAULT_MAX_TOKENS = 4096


class ThinkingSpec(SpecModel):
    """Extended thinking: the model reasons in thinking blocks before it answers or calls a tool."""

    budget_tokens: int = Field(
        ge=MIN_THINKING_BUDGET,
        le=128_000,
        description=(
            "Tokens the model may spend thinking per request (the API's thinking.budget_tokens): at "
            "least 1024 and less than maxTokens, because thinking counts toward maxTokens and toward "
            "the output tokens of usage, budgets and cost."
        ),
    )
    interleaved: bool = Field(
        default=True,
        description=(
            "Let the model think again after each tool result (the API's interleaved-thinking beta, "
            "sent when the run has tools). Turn it off for a model or a Messages-API-compatible "
            "server that does not accept the beta; the model then thinks once per turn."
        ),
    )


#: Combinations the Messages API refuses; the CRD says so at admission, pydantic in the admit phase.
THINKING_WITHIN_MAX_TOKENS: dict[str, JsonValue] = {
    "rule": f"!has(self.thinking) || self.thinking.budgetTokens < "
    f"(has(self.maxTokens) ? self.maxTokens : {DEFAULT_MAX_TOKENS})",
    "message": "model.thinking.budgetTokens must be less than model.maxTokens "
    "(thinking counts toward maxTokens)",
    "fieldPath": ".thinking.budgetTokens",
}
THINKING_TEMPERATURE: dict[str, JsonValue] = {
    "rule": "!has(self.thinking) || !has(self.temperature) || self.temperature == 1.0",
    "message": "model.temperature must be unset or 1 with model.thinking "
    "(the API refuses other temperatures when thinking is on)",
    "fieldPath": ".temperature",
}
THINKING_TOOL_CHOICE: dict[str, JsonValue] = {
    "rule": "!has(self.model) || !has(self.model.thinking) || !has(self.toolChoice) || "
    "self.toolChoice.type == 'auto' || self.toolChoice.type == 'none'",
    "message": "toolChoice.type any or tool forces a tool call, which the API refuses with "
    "model.thinking; use auto or none",
    "fieldPath": ".toolChoice.type",
}


class ModelSpec(SpecModel):
    """Which Claude model to call, where and how."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [THINKING_WITHIN_MAX_TOKENS, THINKING_TEMPERATURE, *PROVIDER_RULES]
        }
    )

    provider: Provider = Field(
        default="anthropic",
        description=(
            "Who serves the model: anthropic (the Messages API, or a compatible server at baseURL), "
            "bedrock (Amazon Bedrock, settings in model.bedrock) or vertex (Google Vertex AI, "
            "settings in model.vertex)."
        ),
    )
    name: str = Field(
        default="claude-sonnet-4-6",
        description=(
            "Model as the provider names it: claude-sonnet-4-6 on Anthropic's API; a model or "
            "inference profile ID on Bedrock (us.anthropic.claude-sonnet-4-5-20250929-v1:0, or an "
            "inference profile ARN); claude-sonnet-4-5@20250929 on Vertex AI. Prices and context "
            "windows are found by the Claude model the ID names."
        ),
        min_length=1,
        max_length=256,
    )
    max_tokens: int = Field(
        default=DEFAULT_MAX_TOKENS,
        ge=1,
        le=128_000,
        description="Upper bound on output tokens per model request (the API's max_tokens).",
    )
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Sampling temperature; omitted from requests when unset (the API default applies).",
    )
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Strings that stop generation. When one of these fires and it is not listed in "
            "finishSequences, the output is treated as drift: discarded and the model re-prompted."
        ),
    )
    finish_sequences: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Stop strings that mean a clean finish: the run ends with the text before the sequence "
            "as its result. They are sent to the API together with stopSequences."
        ),
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "Secret holding the Anthropic API key for this run. When unset the operator's own "
            "ANTHROPIC_API_KEY is used. The key never appears in status, events, logs or metrics."
        ),
    )
    base_url: str | None = Field(
        default=None,
        alias="baseURL",
        max_length=2048,
        pattern=r"^https?://",
        description=(
            "Endpoint base URL: the Messages API's (default: the operator's ANTHROPIC_BASE_URL, else "
            "Anthropic's); with bedrock the bedrock-runtime endpoint's (default: the region's, or the "
            "operator's ANTHROPIC_BEDROCK_BASE_URL), e.g. a VPC endpoint; with vertex Vertex AI's "
            "(default: the region's, or the operator's ANTHROPIC_VERTEX_BASE_URL), e.g. a Private "
            "Service Connect endpoint."
        ),
    )
    bedrock: BedrockSpec | None = Field(
        default=None, description="Amazon Bedrock settings (provider: bedrock)."
    )
    vertex: VertexSpec | None = Field(
        default=None, description="Google Vertex AI settings (provider: vertex)."
    )
    thinking: ThinkingSpec | None = Field(
        default=None,
        description=(
            "Extended thinking; off when unset. Thinking blocks are sent back unchanged in the "
            "following requests, as the API requires. The API refuses it with a temperature other "
            "than 1 and with a toolChoice that forces a tool."
        ),
    )

    @model_validator(mode="after")
    def _provider_settings(self) -> ModelSpec:
        for field in ("bedrock", "vertex"):
            if getattr(self, field) is not None and self.provider != field:
                raise ValueError(f"model.{field} is read only with model.provider: {field}")
        if self.api_key_secret_ref is not None and self.provider != "anthropic":
            raise ValueError(
                f"model.apiKeySecretRef is an Anthropic API key; with {self.provider} use "
                f"model.{self.provider}.credentialsSecretRef"
            )
        return self

    @model_validator(mode="after")
    def _thinking_fits(self) -> ModelSpec:
        if self.thinking is None:
            return self
        if self.thinking.budget_tokens >= self.max_tokens:
            raise ValueError(
                f"model.thinking.budgetTokens ({self.thinking.budget_tokens}) must be less than "
                f"model.maxTokens ({self.max_tokens}): thinking counts toward maxTokens"
            )
        if self.temperature is not None and self.temperature != 1.0:
            raise ValueError(
                f"model.temperature must be unset or 1 with model.thinking, got {self.temperature} "
                "(the API refuses other temperatures when thinking is on)"
            )
        return self
