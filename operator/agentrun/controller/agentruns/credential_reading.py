"""The credentials a run's model provider needs, read from the Secrets its spec names (or none: the
operator's own key, or the pod's cloud identity).

A Secret that is missing, or holds half a key pair or something other than a service account key, keeps the
run Pending with a message saying which; it starts by itself once the Secret is right, because these
are looked at again on the pending run's retry interval.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from agentrun.api.model_spec import ModelSpec
from agentrun.model.access import AwsKeys, ModelAccess, project_of, region_of
from agentrun.model.cloud_clients import google_credentials, google_errors

BEDROCK_API_KEY = "AWS_BEARER_TOKEN_BEDROCK"
ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
SESSION_TOKEN = "AWS_SESSION_TOKEN"


@dataclass(frozen=True)
class Waiting:
    """Why the run cannot start yet (status.conditions reason and message while Pending)."""

    reason: str
    message: str


class SecretReading(Protocol):
    namespace: str

    async def read_secret(self, name: str, key: str) -> str | None: ...


async def model_access(
    model: ModelSpec,
    secrets: SecretReading,
    *,
    operator_key: str | None,
    operator_base_url: str | None,
    env: Mapping[str, str],
) -> ModelAccess | Waiting:
    if model.provider == "bedrock":
        return await _bedrock(model, secrets, env)
    if model.provider == "vertex":
        return await _vertex(model, secrets, env)
    ref = model.api_key_secret_ref
    base_url = model.base_url or operator_base_url
    if ref is None:
        if not operator_key:
            return Waiting(
                "APIKeyMissing", "no spec.model.apiKeySecretRef and the operator has no ANTHROPIC_API_KEY"
            )
        return ModelAccess(base_url=base_url, api_key=operator_key)
    found = await secrets.read_secret(ref.name, ref.key)
    if not found:
        return Waiting(
            "SecretNotFound",
            f"Secret {secrets.namespace}/{ref.name} with key {ref.key!r} "
            "(spec.model.apiKeySecretRef) does not exist yet; the run starts once it does",
        )
    return ModelAccess(base_url=base_url, api_key=found)


async def _bedrock(model: ModelSpec, secrets: SecretReading, env: Mapping[str, str]) -> ModelAccess | Waiting:
    access = ModelAccess("bedrock", base_url=model.base_url, region=region_of(model, env))
    ref = model.bedrock.credentials_secret_ref if model.bedrock else None
    if ref is None:
        return access  # the pod's AWS identity, signed per request
    where = f"Secret {secrets.namespace}/{ref.name} (spec.model.bedrock.credentialsSecretRef)"
    api_key = await secrets.read_secret(ref.name, BEDROCK_API_KEY)
    if api_key:
        return ModelAccess("bedrock", base_url=access.base_url, region=access.region, api_key=api_key)
    key_id = await secrets.read_secret(ref.name, ACCESS_KEY_ID)
    secret_key = await secrets.read_secret(ref.name, SECRET_ACCESS_KEY)
    if key_id and secret_key:
        token = await secrets.read_secret(ref.name, SESSION_TOKEN)
        keys = AwsKeys(key_id, secret_key, token or None)
        return ModelAccess("bedrock", base_url=access.base_url, region=access.region, aws_keys=keys)
    if key_id or secret_key:
        has, lacks = (ACCESS_KEY_ID, SECRET_ACCESS_KEY) if key_id else (SECRET_ACCESS_KEY, ACCESS_KEY_ID)
        return Waiting("SecretInvalid", f"{where} has {has} but no {lacks}; the run starts once it has both")
    return Waiting(
        "SecretNotFound",
        f"{where} with {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY}, or {BEDROCK_API_KEY}, does not exist "
        "yet; the run starts once it does",
    )


async def _vertex(model: ModelSpec, secrets: SecretReading, env: Mapping[str, str]) -> ModelAccess | Waiting:
    access = ModelAccess(
        "vertex", base_url=model.base_url, region=region_of(model, env), project_id=project_of(model, env)
    )
    ref = model.vertex.credentials_secret_ref if model.vertex else None
    if ref is None:
        return access  # the pod's Google identity (Application Default Credentials)
    where = (
        f"Secret {secrets.namespace}/{ref.name} with key {ref.key!r} (spec.model.vertex.credentialsSecretRef)"
    )
    found = await secrets.read_secret(ref.name, ref.key)
    if not found:
        return Waiting("SecretNotFound", f"{where} does not exist yet; the run starts once it does")
    try:
        info = json.loads(found)
    except ValueError:
        info = None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        return Waiting(
            "SecretInvalid",
            f"{where} is not a Google service account key (a JSON file whose type is service_account; "
            "for other identities use the pod's own, Workload Identity); the run starts once it is",
        )
    try:
        google_credentials(info)
    except (ValueError, KeyError, google_errors()) as exc:
        return Waiting(
            "SecretInvalid",
            f"{where} holds a key google-auth refuses ({exc}); the run starts once it is fixed",
        )
    project = access.project_id or info.get("project_id")
    return ModelAccess(
        "vertex", base_url=access.base_url, region=access.region, project_id=project, google_credentials=info
    )
