"""Where a run's model is served: Anthropic's API, Amazon Bedrock or Google Vertex AI, and how the
operator signs in to each (docs/providers/).

A cloud's own identity is the default on its platform: with no Secret named, Bedrock requests are
signed with botocore's default credential chain (IRSA's web identity token, EKS Pod Identity, the
instance profile, AWS_* variables) and Vertex requests carry a token from google-auth's Application
Default Credentials (Workload Identity's metadata server, GOOGLE_APPLICATION_CREDENTIALS): the key
never has to exist as a Secret. A Secret is for clusters outside that cloud.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue

from agentrun.api.spec_base import SecretKeyRef, SpecModel

Provider = Literal["anthropic", "bedrock", "vertex"]
PROVIDERS: tuple[Provider, ...] = ("anthropic", "bedrock", "vertex")

#: AWS region names (us-east-1, eu-central-2, us-gov-west-1, ...).
AWS_REGION_PATTERN = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$"
#: Vertex locations: a region (us-east5, europe-west1) or a multi-region endpoint (global, us, eu).
VERTEX_REGION_PATTERN = r"^([a-z]+-[a-z]+[0-9]+|global|us|eu)$"
GCP_PROJECT_PATTERN = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"


class AwsSecretRef(SpecModel):
    """A Secret holding AWS credentials under the names the AWS CLI and SDKs use for them."""

    name: str = Field(
        min_length=1,
        max_length=253,
        description=(
            "Secret in the run's namespace with either AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(and AWS_SESSION_TOKEN for temporary credentials), requests then signed with SigV4; or "
            "AWS_BEARER_TOKEN_BEDROCK, a Bedrock API key sent as a bearer token."
        ),
    )


class BedrockSpec(SpecModel):
    """Amazon Bedrock: the region's bedrock-runtime endpoint, InvokeModel and its response stream."""

    region: str | None = Field(
        default=None,
        pattern=AWS_REGION_PATTERN,
        max_length=32,
        description=(
            "AWS region of the bedrock-runtime endpoint, e.g. us-east-1. Unset: the operator's "
            "AWS_REGION (set by IRSA and EKS Pod Identity) or AWS_DEFAULT_REGION."
        ),
    )
    credentials_secret_ref: AwsSecretRef | None = Field(
        default=None,
        description=(
            "Secret with AWS keys or a Bedrock API key. Unset: the operator pod's AWS identity "
            "(botocore's default chain: IRSA, EKS Pod Identity, instance profile, AWS_* variables)."
        ),
    )


class VertexSpec(SpecModel):
    """Google Vertex AI: the publisher model's rawPredict and streamRawPredict."""

    region: str | None = Field(
        default=None,
        pattern=VERTEX_REGION_PATTERN,
        max_length=32,
        description=(
            "Vertex location, e.g. us-east5, europe-west1, or global. Unset: the operator's CLOUD_ML_REGION."
        ),
    )
    project_id: str | None = Field(
        default=None,
        pattern=GCP_PROJECT_PATTERN,
        description=(
            "Google Cloud project that is billed. Unset: the operator's ANTHROPIC_VERTEX_PROJECT_ID, "
            "else the project of the credentials."
        ),
    )
    credentials_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "Secret key holding a credentials JSON file: a service account key or a workload "
            "identity federation (external_account) configuration. Unset: the operator pod's Google "
            "identity (Application Default Credentials: GKE Workload Identity, "
            "GOOGLE_APPLICATION_CREDENTIALS)."
        ),
    )


def _only_with(field: str, provider: str) -> dict[str, JsonValue]:
    return {
        "rule": f"!has(self.{field}) || (has(self.provider) && self.provider == '{provider}')",
        "message": f"model.{field} is read only with model.provider: {provider}",
        "fieldPath": f".{field}",
    }


#: The CRD's refusals of settings that belong to another provider (pydantic says the same).
PROVIDER_RULES: list[dict[str, JsonValue]] = [
    _only_with("bedrock", "bedrock"),
    _only_with("vertex", "vertex"),
    {
        "rule": "!has(self.apiKeySecretRef) || !has(self.provider) || self.provider == 'anthropic'",
        "message": "model.apiKeySecretRef is an Anthropic API key; with bedrock use "
        "model.bedrock.credentialsSecretRef, with vertex model.vertex.credentialsSecretRef",
        "fieldPath": ".apiKeySecretRef",
    },
]

#: Server-side compaction (the compact_20260112 beta) only on Anthropic's API: the clouds' endpoints
#: do not offer it (docs/providers/). Context editing (clearing tool results) is on all three.
SERVER_COMPACTION_PROVIDER: dict[str, JsonValue] = {
    "rule": "!has(self.model) || !has(self.model.provider) || self.model.provider == 'anthropic' || "
    "!has(self.context) || !has(self.context.compaction) || "
    "!has(self.context.compaction.strategy) || self.context.compaction.strategy != 'Server' || "
    "(has(self.context.compaction.enabled) && !self.context.compaction.enabled)",
    "message": "context.compaction.strategy Server needs Anthropic's API (its compaction beta); "
    "Bedrock and Vertex AI do not offer it: use strategy Client",
    "fieldPath": ".context.compaction.strategy",
}
