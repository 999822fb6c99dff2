"""The chart's Bedrock and Vertex AI defaults: the operator's environment the SDKs read, and the
ServiceAccount annotations IRSA and GKE Workload Identity bind the pod's identity with."""

from __future__ import annotations

import pytest

from tests.chart.test_chart import env_of
from tests.chart.tooling import Renderer, of_kind

CLOUDS = {
    "serviceAccount": {
        "annotations": {
            "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/agentrun-operator",
            "iam.gke.io/gcp-service-account": "agentrun@team-project.iam.gserviceaccount.com",
        }
    },
    "providers": {
        "bedrock": {
            "region": "eu-central-1",
            "baseURL": "https://vpce-0abc.bedrock-runtime.eu-central-1.vpce.amazonaws.com",
        },
        "vertex": {
            "region": "europe-west1",
            "projectId": "team-project",
            "baseURL": "https://europe-west1-aiplatform.p.googleapis.com/v1",
        },
    },
}


def test_provider_defaults_reach_the_variables_the_sdks_and_the_operator_read(renderer: Renderer) -> None:
    env = env_of(renderer.render(CLOUDS))
    assert {
        name: env[name]["value"]
        for name in env
        if name.startswith(("AWS_", "CLOUD_ML", "ANTHROPIC_", "AGENTRUN_GOOGLE"))
    } == {
        "AWS_REGION": "eu-central-1",
        "ANTHROPIC_BEDROCK_BASE_URL": "https://vpce-0abc.bedrock-runtime.eu-central-1.vpce.amazonaws.com",
        "CLOUD_ML_REGION": "europe-west1",
        "ANTHROPIC_VERTEX_PROJECT_ID": "team-project",
        "ANTHROPIC_VERTEX_BASE_URL": "https://europe-west1-aiplatform.p.googleapis.com/v1",
    }
    defaults = env_of(renderer.render())
    assert not [
        name
        for name in defaults
        if name.startswith(("AWS_", "CLOUD_ML", "ANTHROPIC_VERTEX", "ANTHROPIC_BEDROCK", "AGENTRUN_GOOGLE"))
    ]


def test_the_workload_identity_annotations_are_on_the_operators_service_account(renderer: Renderer) -> None:
    [account] = [
        m
        for m in of_kind(renderer.render(CLOUDS), "ServiceAccount")
        if "console" not in m["metadata"]["name"]
    ]
    assert account["metadata"]["annotations"] == CLOUDS["serviceAccount"]["annotations"]


@pytest.mark.parametrize(
    "bad",
    [
        {"bedrock": {"region": "Frankfurt"}},
        {"vertex": {"projectId": "A"}},
        {"vertex": {"baseURL": "ftp://x"}},
        {"azure": {}},
    ],
)
def test_a_provider_value_no_cloud_would_accept_is_refused_by_the_schema(
    renderer: Renderer, bad: dict[str, object]
) -> None:
    proc = renderer.template({"providers": bad}, check=False)
    assert proc.returncode != 0
    assert "providers" in proc.stderr
