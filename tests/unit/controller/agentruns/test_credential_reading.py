"""What a run's provider credentials become: the Secret's keys, or the pod's own identity, or a Pending
reason that says exactly what is wrong with the Secret."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun.api.model_spec import ModelSpec
from agentrun.controller.agentruns.credential_reading import Waiting, model_access
from agentrun.model.access import AwsKeys, ModelAccess, endpoint_problem
from agentrun_sandbox.messages.cloud_auth import GoogleAccount

TOKEN_URI = "https://oauth2.googleapis.com/token"


class Secrets:
    """Secrets of one namespace, as the run's tool environment reads them (a missing key reads None)."""

    namespace = "team-a"

    def __init__(self, **secrets: dict[str, str]) -> None:
        self._secrets = secrets

    async def read_secret(self, name: str, key: str) -> str | None:
        return self._secrets.get(name, {}).get(key)


async def _access(
    model: dict[str, Any], secrets: Secrets, env: dict[str, str] | None = None
) -> ModelAccess | Waiting:
    return await model_access(
        ModelSpec.model_validate(model), secrets, operator_key=None, operator_base_url=None, env=env or {}
    )


async def test_a_bedrock_secret_with_a_key_pair_and_session_token_signs_as_those_keys() -> None:
    secrets = Secrets(
        aws={"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s3cret", "AWS_SESSION_TOKEN": "tok"}
    )
    found = await _access(
        {
            "provider": "bedrock",
            "bedrock": {"region": "eu-central-1", "credentialsSecretRef": {"name": "aws"}},
        },
        secrets,
    )
    assert found == ModelAccess("bedrock", region="eu-central-1", aws_keys=AwsKeys("AKIA1", "s3cret", "tok"))
    assert "s3cret" not in repr(found) and "tok" not in repr(found)


async def test_a_bedrock_api_key_in_the_secret_wins_over_nothing_else() -> None:
    secrets = Secrets(aws={"AWS_BEARER_TOKEN_BEDROCK": "bedrock-key"})
    found = await _access(
        {"provider": "bedrock", "bedrock": {"credentialsSecretRef": {"name": "aws"}}},
        secrets,
        {"AWS_REGION": "us-west-2"},
    )
    assert found == ModelAccess("bedrock", region="us-west-2", api_key="bedrock-key")


async def test_without_a_secret_bedrock_uses_the_pods_identity_in_the_operators_region() -> None:
    found = await _access({"provider": "bedrock"}, Secrets(), {"AWS_DEFAULT_REGION": "ap-south-1"})
    assert found == ModelAccess("bedrock", region="ap-south-1")


@pytest.mark.parametrize(
    ("data", "reason", "says"),
    [
        (
            {},
            "SecretNotFound",
            "with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_BEARER_TOKEN_BEDROCK, "
            "does not exist yet",
        ),
        (
            {"AWS_ACCESS_KEY_ID": "AKIA1"},
            "SecretInvalid",
            "has AWS_ACCESS_KEY_ID but no AWS_SECRET_ACCESS_KEY",
        ),
        (
            {"AWS_SECRET_ACCESS_KEY": "s"},
            "SecretInvalid",
            "has AWS_SECRET_ACCESS_KEY but no AWS_ACCESS_KEY_ID",
        ),
    ],
)
async def test_a_bedrock_secret_that_is_missing_or_half_a_key_pair_keeps_the_run_pending_saying_which(
    data: dict[str, str], reason: str, says: str
) -> None:
    found = await _access(
        {"provider": "bedrock", "bedrock": {"region": "us-east-1", "credentialsSecretRef": {"name": "aws"}}},
        Secrets(aws=data),
    )
    assert isinstance(found, Waiting)
    assert found.reason == reason
    assert found.message.startswith("Secret team-a/aws (spec.model.bedrock.credentialsSecretRef) ")
    assert says in found.message


async def test_a_vertex_service_account_key_gives_the_project_it_belongs_to() -> None:
    key = GoogleAccount(project="billing-project").new_service_account(TOKEN_URI)
    secrets = Secrets(gcp={"key.json": json.dumps(key)})
    ref = {"name": "gcp", "key": "key.json"}
    found = await _access(
        {"provider": "vertex", "vertex": {"region": "global", "credentialsSecretRef": ref}}, secrets
    )
    assert isinstance(found, ModelAccess)
    assert (found.provider, found.region, found.project_id) == ("vertex", "global", "billing-project")
    assert found.google_credentials == key


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "is not a Google service account key"),
        (
            json.dumps({"type": "external_account", "credential_source": {"file": "/var/run/secrets/token"}}),
            "is not a Google service account key",
        ),
        (
            json.dumps({"type": "service_account", "token_uri": TOKEN_URI, "client_email": "x@y"}),
            "holds a key google-auth refuses",
        ),
    ],
    ids=[
        "not JSON",
        "an external account reading the operator's files",
        "no private key",
    ],
)
async def test_a_vertex_secret_that_is_not_a_usable_service_account_key_keeps_the_run_pending(
    content: str, says: str
) -> None:
    secrets = Secrets(gcp={"key.json": content})
    ref = {"name": "gcp", "key": "key.json"}
    found = await _access(
        {
            "provider": "vertex",
            "vertex": {"region": "us-east5", "projectId": "my-project-1", "credentialsSecretRef": ref},
        },
        secrets,
    )
    assert isinstance(found, Waiting)
    assert found.reason == "SecretInvalid"
    assert says in found.message, found.message


@pytest.mark.parametrize(
    ("model", "env", "problem"),
    [
        (
            {"provider": "bedrock"},
            {},
            "spec.model.bedrock.region is unset and the operator has no AWS_REGION",
        ),
        (
            {"provider": "vertex", "vertex": {"projectId": "team-project"}},
            {},
            "spec.model.vertex.region is unset and the operator has no CLOUD_ML_REGION",
        ),
        ({"provider": "bedrock"}, {"AWS_REGION": "us-east-1"}, None),
        ({"provider": "vertex", "vertex": {"region": "global"}}, {}, "spec.model.vertex.projectId is unset"),
        ({"provider": "vertex", "vertex": {"region": "global"}}, {"ANTHROPIC_VERTEX_PROJECT_ID": "p"}, None),
        ({"provider": "vertex", "vertex": {"region": "global", "projectId": "team-project"}}, {}, None),
        (
            {"provider": "vertex", "vertex": {"region": "global"}, "baseURL": "https://collector.example"},
            {},
            "spec.model.baseURL with provider vertex needs spec.model.vertex.credentialsSecretRef",
        ),
        (
            {
                "provider": "bedrock",
                "bedrock": {"region": "us-east-1", "credentialsSecretRef": {"name": "a"}},
                "baseURL": "https://vpce.example",
            },
            {},
            None,
        ),
    ],
)
def test_where_a_provider_cannot_be_called_the_run_is_told_before_any_request(
    model: dict[str, Any], env: dict[str, str], problem: str | None
) -> None:
    found = endpoint_problem(ModelSpec.model_validate(model), env)
    assert (found if found is None or problem is None else found[: len(problem)]) == problem
