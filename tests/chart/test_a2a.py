"""The chart's A2A server (a2a.enabled): a Deployment and Service of its own, whose account may only read
Agents (for their cards): tasks are created with each caller's own token."""

from __future__ import annotations

import kubernetes_validate

from tests.chart.tooling import Manifest, Renderer, of_kind

ENABLED = {"a2a": {"enabled": True}}
READ_AGENTS = [{"apiGroups": ["agentrun.dev"], "resources": ["agents"], "verbs": ["get"]}]


def a2a_objects(manifests: list[Manifest]) -> list[Manifest]:
    labels = [(m, (m["metadata"].get("labels") or {})) for m in manifests]
    return [m for m, found in labels if found.get("app.kubernetes.io/component") == "a2a"]


def test_no_a2a_server_unless_asked_for(renderer: Renderer) -> None:
    assert a2a_objects(renderer.render()) == []


def test_the_a2a_objects_are_valid_and_its_pod_is_restricted(renderer: Renderer) -> None:
    values = {"a2a": {"enabled": True, "publicURL": "https://agents.example.com", "waitSeconds": 120}}
    objects = a2a_objects(renderer.render(values))
    assert {m["kind"] for m in objects} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
    }
    for manifest in objects:
        kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)
    [deployment] = of_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["agentrun", "a2a"]
    assert {"--public-url=https://agents.example.com", "--wait-seconds=120", "--port=8091"} <= set(
        container["args"]
    )
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_the_servers_own_account_may_only_read_agents(renderer: Renderer) -> None:
    objects = a2a_objects(renderer.render(ENABLED))
    [role] = of_kind(objects, "ClusterRole")
    assert role["rules"] == READ_AGENTS


def test_listed_namespaces_get_a_binding_each_and_no_cluster_wide_one(renderer: Renderer) -> None:
    objects = a2a_objects(renderer.render({"a2a": {"enabled": True, "namespaces": ["team-a", "team-b"]}}))
    assert of_kind(objects, "ClusterRoleBinding") == []
    assert sorted(b["metadata"]["namespace"] for b in of_kind(objects, "RoleBinding")) == ["team-a", "team-b"]
    [deployment] = of_kind(objects, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(args)


def test_a_public_url_that_is_no_url_is_refused_by_the_schema(renderer: Renderer) -> None:
    proc = renderer.template({"a2a": {"enabled": True, "publicURL": "agents.example.com"}}, check=False)
    assert proc.returncode != 0 and "publicURL" in proc.stderr
