"""The approval policy: rendered by the chart (on by default) and shipped as the same plain manifest."""

from __future__ import annotations

from typing import Any

import yaml

from tests.chart.tooling import REPO, Manifest, Renderer

MANIFEST = REPO / "deploy" / "approval-policy.yaml"
POLICY = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"


def _policy_objects(manifests: list[Manifest]) -> list[Manifest]:
    """The approval policy and its binding (the chart renders the quota policy beside them)."""
    return [m for m in manifests if m["kind"] in (POLICY, BINDING) and "approval" in m["metadata"]["name"]]


def _plain() -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]


def test_the_chart_installs_the_approval_policy_by_default_for_every_agentrun(renderer: Renderer) -> None:
    policy, binding = _policy_objects(renderer.render())
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["metadata"]["name"] == "agentrun-operator-approval-decider"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["agentrun.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["agentruns"],
        }
    ]
    assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_approval_policy_enabled_false_leaves_it_out(renderer: Renderer) -> None:
    assert _policy_objects(renderer.render({"approvalPolicy": {"enabled": False}})) == []


def test_every_kubernetes_version_the_chart_accepts_gets_the_policy(renderer: Renderer) -> None:
    rendered = renderer.template(extra=["--kube-version", "1.33.0"])
    docs = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert sorted(m["kind"] for m in _policy_objects(docs)) == sorted([POLICY, BINDING])


def _comparable(manifest: Manifest) -> dict[str, Any]:
    spec = dict(manifest["spec"])
    spec.pop("policyName", None)  # each points at its own policy's name
    return {"apiVersion": manifest["apiVersion"], "kind": manifest["kind"], "spec": spec}


def test_the_plain_manifest_is_the_policy_the_chart_renders(renderer: Renderer) -> None:
    chart = _policy_objects(renderer.render())
    plain = _plain()
    assert [_comparable(m) for m in plain] == [_comparable(m) for m in chart]
    policy, binding = plain
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == "agentrun-approval-decider"
    # A different name from the chart's: installing both by mistake duplicates a check, never collides.
    assert policy["metadata"]["name"] not in {m["metadata"]["name"] for m in chart}
