"""The chart's console (console.enabled): a Deployment and Service of its own, with no rights over runs."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.chart.tooling import Manifest, Renderer, of_kind

TOKEN = {"console": {"enabled": True}}
PROXY = {"console": {"enabled": True, "auth": "proxy"}}


def console_objects(manifests: list[Manifest]) -> list[Manifest]:
    labels = [(m, (m["metadata"].get("labels") or {})) for m in manifests]
    return [m for m, found in labels if found.get("app.kubernetes.io/component") == "console"]


def deployment(manifests: list[Manifest], component: str) -> Manifest:
    [found] = [
        m
        for m in of_kind(manifests, "Deployment")
        if m["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def test_no_console_unless_asked_for(renderer: Renderer) -> None:
    assert console_objects(renderer.render()) == []


@pytest.mark.parametrize("values", [TOKEN, PROXY], ids=["token", "proxy"])
def test_the_console_objects_are_valid_and_its_pod_is_restricted(renderer: Renderer, values: Any) -> None:
    objects = console_objects(renderer.render(values))
    assert {m["kind"] for m in objects} >= {"ServiceAccount", "Deployment", "Service"}
    for manifest in objects:
        kubernetes_validate.validate(manifest, kubernetes_validate.latest_version(), strict=True)
    pod = deployment(objects, "console")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["agentrun", "console"]
    assert f"--auth={values['console'].get('auth', 'token')}" in container["args"]
    assert "--secure-cookies" in container["args"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_signing_in_with_tokens_the_console_is_granted_nothing(renderer: Renderer) -> None:
    manifests = renderer.render(TOKEN)
    account = next(m for m in console_objects(manifests) if m["kind"] == "ServiceAccount")["metadata"]["name"]
    bindings = of_kind(manifests, "RoleBinding") + of_kind(manifests, "ClusterRoleBinding")
    bound = [b for b in bindings for s in b.get("subjects") or [] if s.get("name") == account]
    assert bound == []


def test_behind_a_proxy_the_console_may_only_impersonate(renderer: Renderer) -> None:
    objects = console_objects(renderer.render(PROXY))
    [role] = of_kind(objects, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["users", "groups", "serviceaccounts"], "verbs": ["impersonate"]}
    ]
    args = deployment(objects, "console")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--user-header=X-Forwarded-User", "--groups-header=X-Forwarded-Groups"} <= set(args)


def test_the_operators_selectors_do_not_take_in_the_console_pods(renderer: Renderer) -> None:
    values = {**TOKEN, "replicas": 2, "networkPolicy": {"enabled": True}}
    manifests = renderer.render(values)
    console_pod = deployment(manifests, "console")["spec"]["template"]["metadata"]["labels"]
    operator = deployment(manifests, "operator")
    selectors = [operator["spec"]["selector"]["matchLabels"]]
    selectors += [
        s["spec"]["selector"] for s in of_kind(manifests, "Service") if "console" not in s["metadata"]["name"]
    ]
    selectors += [p["spec"]["selector"]["matchLabels"] for p in of_kind(manifests, "PodDisruptionBudget")]
    selectors += [p["spec"]["podSelector"]["matchLabels"] for p in of_kind(manifests, "NetworkPolicy")]
    assert len(selectors) >= 4
    for selector in selectors:
        assert not all(console_pod.get(k) == v for k, v in selector.items()), selector
    console_service = next(s for s in of_kind(manifests, "Service") if "console" in s["metadata"]["name"])
    assert all(console_pod.get(k) == v for k, v in console_service["spec"]["selector"].items())


def test_with_transcripts_in_postgresql_the_console_gets_the_dsn_from_the_secret_only(
    renderer: Renderer,
) -> None:
    values = {**TOKEN, "operator": {"transcriptStorage": "postgres"}, "database": {"existingSecret": "db"}}
    container = deployment(renderer.render(values), "console")["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [
        {"name": "AGENTRUN_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": "db", "key": "url"}}}
    ]
    plain = deployment(renderer.render(TOKEN), "console")["spec"]["template"]["spec"]["containers"][0]
    assert "env" not in plain


def test_only_the_peers_named_reach_the_console_when_named(renderer: Renderer) -> None:
    proxy_pods = {"podSelector": {"matchLabels": {"app": "oauth2-proxy"}}}
    values = {"console": {"enabled": True, "auth": "proxy", "ingressFrom": [proxy_pods]}}
    objects = console_objects(renderer.render(values))
    [policy] = of_kind(objects, "NetworkPolicy")
    kubernetes_validate.validate(policy, kubernetes_validate.latest_version(), strict=True)
    pod_labels = deployment(objects, "console")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    assert policy["spec"]["ingress"] == [
        {"from": [proxy_pods], "ports": [{"port": "http", "protocol": "TCP"}]}
    ]
    assert of_kind(console_objects(renderer.render(PROXY)), "NetworkPolicy") == []
