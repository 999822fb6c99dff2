"""The per-run quota policy: rendered by the chart (on by default) and shipped as the same plain manifest."""

from __future__ import annotations

from typing import Any

import yaml

from agentrun.api.quota import PER_RUN_FIELDS
from tests.chart.tooling import REPO, Manifest, Renderer

MANIFEST = REPO / "deploy" / "quota-policy.yaml"
POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"
NAME = "agentrun-operator-quota-per-run"


def _quota_objects(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in (POLICY, BINDING) and "quota" in m["metadata"]["name"]]


def _plain() -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def test_the_chart_installs_the_quota_policy_by_default_with_every_quota_of_the_namespace_as_parameter(
    renderer: Renderer,
) -> None:
    policy, binding = _quota_objects(renderer.render())
    assert (policy["kind"], binding["kind"]) == (POLICY, BINDING)
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == NAME
    assert policy["spec"]["paramKind"] == {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRunQuota"}
    assert binding["spec"] == {
        "policyName": NAME,
        "validationActions": ["Deny"],
        "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    # CREATE only: a quota lowered later must not keep an admitted run from being cancelled or approved.
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["agentrun.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["agentruns"],
        }
    ]
    assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_the_quota_policy_checks_every_per_run_limit_and_names_the_quota_and_the_field(
    renderer: Renderer,
) -> None:
    policy, _ = _quota_objects(renderer.render())
    validations = policy["spec"]["validations"]
    assert len(validations) == len(PER_RUN_FIELDS)
    for field, validation in zip(PER_RUN_FIELDS, validations, strict=True):
        assert f"object.spec.limits.{field} <= params.spec.perRun.{field}.max" in validation["expression"]
        assert validation["reason"] == "Forbidden"
        assert f"spec.limits.{field} " in validation["messageExpression"]
        assert "variables.quota" in validation["messageExpression"]
        assert f"spec.limits.{field} is above perRun.{field}.max" in validation["message"]


def test_quota_policy_enabled_false_leaves_it_out(renderer: Renderer) -> None:
    assert _quota_objects(renderer.render({"quotaPolicy": {"enabled": False}})) == []
    assert len(_quota_objects(renderer.render({"approvalPolicy": {"enabled": False}}))) == 2


def _comparable(manifest: Manifest) -> dict[str, Any]:
    spec = dict(manifest["spec"])
    spec.pop("policyName", None)  # each points at its own policy's name
    return {"apiVersion": manifest["apiVersion"], "kind": manifest["kind"], "spec": spec}


def test_the_plain_quota_manifest_is_the_policy_the_chart_renders(renderer: Renderer) -> None:
    chart = _quota_objects(renderer.render())
    plain = _plain()
    assert [_comparable(m) for m in plain] == [_comparable(m) for m in chart]
    policy, binding = plain
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == "agentrun-quota-per-run"
    assert policy["metadata"]["name"] not in {m["metadata"]["name"] for m in chart}
