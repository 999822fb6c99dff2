"""How the operator reaches a run's model: the provider, its endpoint and the credentials read for it.

Built once per run from its spec, the Secrets it names and the operator's environment, before the
first request; the client pool keys its clients by `fingerprint`, so runs that share credentials
share connections and no key is ever kept in a dictionary key or a log line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.api.model_spec import ModelSpec
from agentrun.api.provider_spec import Provider

#: Where the SDKs look for a region or project the spec leaves out (the variables EKS and GKE set).
AWS_REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
VERTEX_REGION_VARIABLE = "CLOUD_ML_REGION"
VERTEX_PROJECT_VARIABLE = "ANTHROPIC_VERTEX_PROJECT_ID"


@dataclass(frozen=True)
class AwsKeys:
    """An access key pair from a Secret (with a session token when it is temporary)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ModelAccess:
    """Provider, endpoint, region/project, and whatever credentials a Secret gave (none: the pod's
    own cloud identity, found by botocore's or google-auth's default chain per request)."""

    provider: Provider = "anthropic"
    base_url: str | None = None
    #: The Anthropic API key, or a Bedrock API key (a bearer token).
    api_key: str | None = field(default=None, repr=False)
    aws_keys: AwsKeys | None = field(default=None, repr=False)
    region: str | None = None
    project_id: str | None = None
    #: A Google credentials file's content (service account key or external_account configuration).
    google_credentials: Mapping[str, Any] | None = field(default=None, repr=False)

    def fingerprint(self) -> str:
        """One digest of everything that makes a client different; secrets only ever hashed."""
        keys = self.aws_keys
        material = json.dumps(
            [
                self.provider,
                self.base_url,
                self.api_key,
                [keys.access_key_id, keys.secret_access_key, keys.session_token] if keys else None,
                self.region,
                self.project_id,
                self.google_credentials,
            ],
            sort_keys=True,
        )
        return hashlib.sha256(material.encode()).hexdigest()


def endpoint_problem(model: ModelSpec, env: Mapping[str, str]) -> str | None:
    """What the spec and the operator's environment leave unknown about where to send requests, as
    the message of an InvalidSpec (None when the provider can be called)."""
    if model.provider in ("bedrock", "vertex") and model.base_url is not None and _own_identity(model):
        return (
            f"spec.model.baseURL with provider {model.provider} needs "
            f"spec.model.{model.provider}.credentialsSecretRef: the operator signs in with its own cloud "
            "identity only to the endpoints its own configuration names (ANTHROPIC_BEDROCK_BASE_URL, "
            "ANTHROPIC_VERTEX_BASE_URL), never to an address a run chose"
        )
    if model.provider == "vertex" and project_of(model, env) is None and _own_identity(model):
        # A key in a Secret names its project; the pod's own identity does not, reliably, on its own.
        return (
            "spec.model.vertex.projectId is unset and the operator has no ANTHROPIC_VERTEX_PROJECT_ID: "
            "name the Google Cloud project that is billed"
        )
    if model.provider in ("bedrock", "vertex") and region_of(model, env) is None:
        if model.provider == "bedrock":
            return (
                "spec.model.bedrock.region is unset and the operator has no AWS_REGION or "
                "AWS_DEFAULT_REGION: name the region of the Bedrock endpoint, e.g. us-east-1"
            )
        return (
            "spec.model.vertex.region is unset and the operator has no CLOUD_ML_REGION: name the "
            "Vertex AI location, e.g. us-east5 or global"
        )
    return None


def region_of(model: ModelSpec, env: Mapping[str, str]) -> str | None:
    if model.provider == "bedrock":
        given = model.bedrock.region if model.bedrock else None
        return given or _first(env, AWS_REGION_VARIABLES)
    if model.provider == "vertex":
        given = model.vertex.region if model.vertex else None
        return given or env.get(VERTEX_REGION_VARIABLE) or None
    return None


def project_of(model: ModelSpec, env: Mapping[str, str]) -> str | None:
    if model.provider != "vertex":
        return None
    given = model.vertex.project_id if model.vertex else None
    return given or env.get(VERTEX_PROJECT_VARIABLE) or None


def _own_identity(model: ModelSpec) -> bool:
    settings = model.bedrock if model.provider == "bedrock" else model.vertex
    return settings is None or settings.credentials_secret_ref is None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    return next((env[name] for name in names if env.get(name)), None)
