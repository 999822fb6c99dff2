"""The Helm chart, rendered by the real `helm` binary and checked against Kubernetes' own schemas."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.tooling import (
    CHART,
    MONITORING_API,
    NAMESPACE,
    REPO,
    Manifest,
    Renderer,
    Tool,
    of_kind,
    one,
)

MIN_KUBERNETES = "1.33.0"
CRD_FILE = "agentruns.agentrun.dev.yaml"
CRD_FILES = (
    CRD_FILE,
    "agentrunquotas.agentrun.dev.yaml",
    "agents.agentrun.dev.yaml",
    "agentschedules.agentrun.dev.yaml",
    "sandboxtemplates.agentrun.dev.yaml",
)
OPERATOR_SA = "agentrun-operator"
OPERATOR_SUBJECT = {"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": NAMESPACE}

NAMESPACES_SCOPE: dict[str, Any] = {
    "rbac": {"scope": "namespaces"},
    "watchNamespaces": ["team-a", "team-b"],
}
# Every optional feature switched on, every list and map filled in.
EVERYTHING: dict[str, Any] = {
    "image": {"digest": "sha256:" + "0" * 64},
    "imagePullSecrets": ["registry-credentials"],
    "rbac": {"impersonationServiceAccountNames": ["agent"]},
    "serviceAccount": {"annotations": {"example.com/role": "agentrun"}},
    "operator": {
        "logFormat": "text",
        "maxConcurrentRuns": 7,
        "defaultTTLSecondsAfterFinished": 3600,
        "transcriptStorage": "configmap",
        "anthropicBaseURL": "https://llm-gateway.example.com/anthropic",
        "extraArgs": ["--verbose"],
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"}],
    },
    "apiKey": {"existingSecret": "anthropic", "key": "token"},
    "resources": {"limits": {"cpu": "1"}},
    "podAnnotations": {"example.com/team": "platform"},
    "podLabels": {"team": "platform"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                        ]
                    }
                ]
            }
        }
    },
    "metrics": {
        "service": {"annotations": {"prometheus.io/scrape": "true"}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        "dashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "Agents"}},
    },
    "networkPolicy": {
        "enabled": True,
        "apiServer": {"cidrs": ["172.18.0.2/32"]},
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "extraEgress": [{"to": [{"podSelector": {}}], "ports": [{"port": 8443, "protocol": "TCP"}]}],
    },
}
SCENARIOS = {"default": {}, "namespaces-scope": NAMESPACES_SCOPE, "everything-enabled": EVERYTHING}

# What the operator needs from the API (its contract): (apiGroup, resource) -> verbs. That the
# operator really uses each of them, and nothing else, is checked against its requests in
# tests/integration/test_rbac_coverage.py.
CLUSTER_SCOPED_NEEDS = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
}
NAMESPACE_WATCH_NEEDS = {("", "namespaces"): {"list", "watch"}}  # Kopf with a list of namespaces
NAMESPACED_NEEDS = {
    # get, create: agent tools create child runs and read them while they wait (and schedules create runs).
    ("agentrun.dev", "agentruns"): {"get", "list", "watch", "create", "patch", "delete"},
    ("agentrun.dev", "agentruns/status"): {"patch"},
    ("agentrun.dev", "agentruns/finalizers"): {"update"},
    ("agentrun.dev", "agentrunquotas"): {"get", "list", "watch"},
    ("agentrun.dev", "agentrunquotas/status"): {"update"},
    ("agentrun.dev", "agents"): {"get", "list", "watch"},
    ("agentrun.dev", "agents/status"): {"patch"},
    ("agentrun.dev", "agentschedules"): {"list", "watch"},
    ("agentrun.dev", "agentschedules/status"): {"patch"},
    # get: a run's template (spec.sandbox.templateRef); list, watch: Kopf wakes waiting runs and pools.
    ("agentrun.dev", "sandboxtemplates"): {"get", "list", "watch"},
    ("", "events"): {"create", "patch"},
    ("", "secrets"): {"get", "create"},
    # get: the ConfigMaps a sandbox mounts, waited for (tools/registry.py mount_uses).
    ("", "configmaps"): {"get"},
    ("", "serviceaccounts"): {"impersonate"},
    # The NetworkPolicy of each run's sandbox (tools/sandbox/pods.py): made and removed by the operator.
    ("networking.k8s.io", "networkpolicies"): {"create", "delete"},
}
CONFIGMAP_NEEDS = {("", "configmaps"): {"get", "create"}}
# Replica membership, in the release namespace only (controller/replicas/membership.py).
LEASE_NEEDS = {("coordination.k8s.io", "leases"): {"get", "list", "create", "update", "delete"}}


def grants(role: Manifest) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs granted by a Role or ClusterRole."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def rules_of(manifests: list[Manifest]) -> Iterator[tuple[Manifest, dict[str, Any]]]:
    for role in of_kind(manifests, "ClusterRole") + of_kind(manifests, "Role"):
        for rule in role.get("rules") or []:
            yield role, rule


def operator_container(manifests: list[Manifest]) -> dict[str, Any]:
    containers = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return dict(containers[0])


def env_of(manifests: list[Manifest]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in operator_container(manifests).get("env", [])}


def lease_role(manifests: list[Manifest]) -> Manifest:
    """The one Role in the release namespace: the replicas' Leases."""
    [role] = [r for r in of_kind(manifests, "Role") if r["metadata"]["namespace"] == NAMESPACE]
    return role


def run_roles(manifests: list[Manifest]) -> list[Manifest]:
    """The Roles of the watched namespaces (scope "namespaces")."""
    return [r for r in of_kind(manifests, "Role") if r["metadata"]["namespace"] != NAMESPACE]


# --- helm lint, rendering and Kubernetes schema validation -----------------------------------------


def test_chart_metadata_declares_an_application_chart_for_kubernetes_1_33_and_later() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["type"] == "application"
    assert chart["name"] == "agentrun-operator"
    assert chart["version"] == "0.1.0"
    assert chart["appVersion"] == "0.1.0"
    assert chart["description"].strip()
    # 1.33: the CRD's append-only rule on spec.approvals uses CEL's two-variable comprehensions.
    assert chart["kubeVersion"].startswith(">=1.33")


def test_helm_lint_strict_passes_with_default_values(helm: Tool) -> None:
    proc = helm.run("lint", "--strict", CHART)
    assert "0 chart(s) failed" in proc.stdout


def test_helm_lint_strict_passes_in_namespaces_scope(helm: Tool) -> None:
    scope = ["--set", "rbac.scope=namespaces", "--set", "watchNamespaces={team-a,team-b}"]
    proc = helm.run("lint", "--strict", CHART, *scope)
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("kubernetes", [MIN_KUBERNETES, kubernetes_validate.latest_version()])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rendered_manifests_are_valid_kubernetes_objects(
    renderer: Renderer, scenario: str, kubernetes: str
) -> None:
    crd_present = (CHART / "crds" / CRD_FILE).is_file()
    # Rendered for that Kubernetes version: what the chart installs depends on it (the approval policy).
    rendered = renderer.template(
        SCENARIOS[scenario],
        api_versions=[MONITORING_API],
        include_crds=crd_present,
        extra=["--kube-version", kubernetes],
    )
    manifests = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert manifests
    problems = []
    for manifest in manifests:
        if manifest["apiVersion"] == MONITORING_API:
            # The Prometheus Operator's kinds have no schema in kubernetes-validate; other tests check them.
            assert manifest["kind"] in {"ServiceMonitor", "PrometheusRule"}
            continue
        try:
            kubernetes_validate.validate(manifest, kubernetes, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(map(str, error.path))
            problems.append(f"{manifest['kind']}/{manifest['metadata']['name']}: {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            problems.append(error.message)
    assert not problems, "\n".join(problems)


def test_the_chart_refuses_kubernetes_older_than_1_33(renderer: Renderer) -> None:
    refused = renderer.template(check=False, extra=["--kube-version", "1.32.9"])
    assert refused.returncode != 0
    assert "kubeVersion" in refused.stderr or "incompatible" in refused.stderr
    assert renderer.template(check=False, extra=["--kube-version", MIN_KUBERNETES]).returncode == 0


def test_install_notes_render_and_warn_when_there_is_no_default_api_key(helm: Tool) -> None:
    install: list[str | Path] = ["install", "r", CHART, "--dry-run=client", "--namespace", NAMESPACE]
    without_key = helm.run(*install).stdout
    assert "WARNING: no default API key" in without_key
    with_key = helm.run(*install, "--set", "apiKey.existingSecret=k").stdout
    assert "WARNING" not in with_key
    assert "create secret generic k" in with_key


# --- the Deployment ---------------------------------------------------------------------------------


def test_operator_runs_one_replica_by_default_and_rolls_a_new_pod_in_before_the_old_leaves(
    renderer: Renderer,
) -> None:
    deployment = one(renderer.render(), "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert one(renderer.render({"replicas": 3}), "Deployment")["spec"]["replicas"] == 3


def test_every_replica_joins_the_release_namespace_membership_named_after_its_pod(renderer: Renderer) -> None:
    env = env_of(
        renderer.render(
            {
                "operator": {
                    "leaseDurationSeconds": 30,
                    "leaseRenewSeconds": 4,
                    "handoffGraceSeconds": 12,
                    "loopStallSeconds": 45,
                }
            }
        )
    )
    assert env["AGENTRUN_LEASE_NAMESPACE"]["value"] == NAMESPACE
    assert env["AGENTRUN_REPLICA_GROUP"]["value"] == OPERATOR_SA, "one group per release"
    pod_name = {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["AGENTRUN_REPLICA_NAME"]["valueFrom"] == pod_name
    assert env["POD_NAME"]["valueFrom"] == pod_name
    assert env["AGENTRUN_LEASE_DURATION_SECONDS"]["value"] == "30"
    assert env["AGENTRUN_LEASE_RENEW_SECONDS"]["value"] == "4"
    assert env["AGENTRUN_HANDOFF_GRACE_SECONDS"]["value"] == "12"
    assert env["AGENTRUN_LOOP_STALL_SECONDS"]["value"] == "45"
    defaults = env_of(renderer.render())
    assert (
        defaults["AGENTRUN_LEASE_DURATION_SECONDS"]["value"],
        defaults["AGENTRUN_LEASE_RENEW_SECONDS"]["value"],
        defaults["AGENTRUN_HANDOFF_GRACE_SECONDS"]["value"],
        defaults["AGENTRUN_LOOP_STALL_SECONDS"]["value"],
    ) == (
        "30",
        "5",
        "30",
        "30",
    )


def test_a_disruption_budget_lets_one_replica_go_at_a_time_only_when_there_are_several(
    renderer: Renderer,
) -> None:
    assert not of_kind(renderer.render(), "PodDisruptionBudget")
    manifests = renderer.render({"replicas": 2})
    budget = one(manifests, "PodDisruptionBudget")
    assert budget["metadata"]["namespace"] == NAMESPACE
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_replicas_prefer_different_nodes_unless_affinity_is_set(renderer: Renderer) -> None:
    manifests = renderer.render({"replicas": 3})
    deployment = one(manifests, "Deployment")
    affinity = deployment["spec"]["template"]["spec"]["affinity"]
    [term] = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selected = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selected.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAntiAffinity"], "soft only"
    own = one(renderer.render(EVERYTHING), "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert own == EVERYTHING["affinity"]


@pytest.mark.parametrize("replicas", [0, -1, "two"])
def test_a_replica_count_below_one_or_not_a_number_is_refused(renderer: Renderer, replicas: Any) -> None:
    proc = renderer.template({"replicas": replicas}, check=False)
    assert proc.returncode != 0
    assert "replicas" in proc.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_operator_pod_meets_the_restricted_pod_security_standard(renderer: Renderer, scenario: str) -> None:
    pod = one(renderer.render(SCENARIOS[scenario]), "Deployment")["spec"]["template"]["spec"]
    pod_security = pod["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key)
    for container in pod["containers"] + pod.get("initContainers", []):
        security = container["securityContext"]
        user = security.get("runAsUser", pod_security.get("runAsUser"))
        group = security.get("runAsGroup", pod_security.get("runAsGroup"))
        assert type(user) is int, "a numeric UID"
        assert user == 65532
        assert type(group) is int, "a numeric GID"
        assert group == 65532
        assert security["runAsNonRoot"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security.get("privileged", False) is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, "a read-only root filesystem needs a writable /tmp"
    volumes = {v["name"]: v for v in pod["volumes"]}
    tmp = volumes[mounts["/tmp"]]
    assert set(tmp) == {"name", "emptyDir"}, "only emptyDir volumes, no hostPath"


def test_liveness_asks_healthz_on_the_health_port_and_readiness_readyz_on_the_metrics_port(
    renderer: Renderer,
) -> None:
    container = operator_container(renderer.render({"operator": {"healthPort": 9091, "metricsPort": 9090}}))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (ports["health"], ports["http-metrics"]) == (9091, 9090)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert "--health-port=9091" in container["args"] and "--metrics-port=9090" in container["args"]


def test_operator_has_resource_requests_and_limits(renderer: Renderer) -> None:
    resources = operator_container(renderer.render())["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert "memory" in resources["limits"]
    assert "cpu" in operator_container(renderer.render(EVERYTHING))["resources"]["limits"]


def test_operator_args_watch_all_namespaces_in_cluster_scope(renderer: Renderer) -> None:
    args = operator_container(renderer.render())["args"]
    assert "--all-namespaces" in args
    assert not [a for a in args if a.startswith("--namespace")]
    defaults = {"--metrics-port=8080", "--health-port=8081", "--log-format=json", "--max-concurrent-runs=50"}
    assert defaults <= set(args)


def test_operator_args_list_each_watched_namespace_in_namespaces_scope(renderer: Renderer) -> None:
    args = operator_container(renderer.render(NAMESPACES_SCOPE))["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_operator_settings_from_values_reach_args_and_environment(renderer: Renderer) -> None:
    manifests = renderer.render(EVERYTHING)
    container = operator_container(manifests)
    assert container["image"] == "ghcr.io/agentrun-dev/agentrun-operator@sha256:" + "0" * 64
    assert {"--log-format=text", "--max-concurrent-runs=7"} <= set(container["args"])
    assert container["args"][-1] == "--verbose"
    env = env_of(manifests)
    assert env["AGENTRUN_DEFAULT_TTL_SECONDS_AFTER_FINISHED"]["value"] == "3600"
    assert env["AGENTRUN_TRANSCRIPT_STORAGE"]["value"] == "configmap"
    assert env["ANTHROPIC_BASE_URL"]["value"] == "https://llm-gateway.example.com/anthropic"
    assert env["HTTPS_PROXY"]["value"] == "http://proxy.example.com:3128"
    defaults = env_of(renderer.render())
    assert defaults["AGENTRUN_TRANSCRIPT_STORAGE"]["value"] == "secret"
    assert "AGENTRUN_DEFAULT_TTL_SECONDS_AFTER_FINISHED" not in defaults
    assert "ANTHROPIC_BASE_URL" not in defaults
    image = operator_container(renderer.render())["image"]
    assert image == "ghcr.io/agentrun-dev/agentrun-operator:0.1.0", "the tag defaults to appVersion"


def test_api_key_comes_only_from_a_secret_reference(renderer: Renderer) -> None:
    assert "ANTHROPIC_API_KEY" not in env_of(renderer.render())
    api_key = env_of(renderer.render(EVERYTHING))["ANTHROPIC_API_KEY"]
    assert "value" not in api_key
    assert api_key["valueFrom"] == {"secretKeyRef": {"name": "anthropic", "key": "token"}}
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["apiKey"]["properties"]) == {"existingSecret", "key"}
    rejected = renderer.template({"apiKey": {"value": "sk-ant-do-not-put-me-here"}}, check=False)
    assert rejected.returncode != 0


# --- RBAC ---------------------------------------------------------------------------------------------


def test_cluster_scope_grants_exactly_what_the_operator_needs_through_one_cluster_role(
    renderer: Renderer,
) -> None:
    manifests = renderer.render()
    assert not run_roles(manifests)
    assert grants(one(manifests, "ClusterRole")) == CLUSTER_SCOPED_NEEDS | NAMESPACED_NEEDS
    binding = one(manifests, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(manifests, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [OPERATOR_SUBJECT]


def test_namespaces_scope_has_no_cluster_role_rules_for_namespaced_resources(renderer: Renderer) -> None:
    manifests = renderer.render(NAMESPACES_SCOPE)
    assert grants(one(manifests, "ClusterRole")) == CLUSTER_SCOPED_NEEDS | NAMESPACE_WATCH_NEEDS
    roles = run_roles(manifests)
    bindings = [b for b in of_kind(manifests, "RoleBinding") if b["metadata"]["namespace"] != NAMESPACE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for role in roles:
        assert grants(role) == NAMESPACED_NEEDS
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[0]["metadata"]["name"],
        }
        assert binding["subjects"] == [OPERATOR_SUBJECT]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_impersonation_is_limited_to_service_accounts(renderer: Renderer, scenario: str) -> None:
    impersonating = [
        rule for _, rule in rules_of(renderer.render(SCENARIOS[scenario])) if "impersonate" in rule["verbs"]
    ]
    assert impersonating
    for rule in impersonating:
        assert rule["apiGroups"] == [""]
        assert rule["resources"] == ["serviceaccounts"]
        assert rule["verbs"] == ["impersonate"]


def test_impersonation_can_be_narrowed_to_named_service_accounts_or_disabled(renderer: Renderer) -> None:
    named = [rule for _, rule in rules_of(renderer.render(EVERYTHING)) if "impersonate" in rule["verbs"]]
    assert [rule.get("resourceNames") for rule in named] == [["agent"]]
    disabled = renderer.render({"rbac": {"impersonateServiceAccounts": False}})
    assert not [rule for _, rule in rules_of(disabled) if "impersonate" in rule["verbs"]]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rbac_rules_use_no_wildcards_and_grant_leases_only_in_the_release_namespace(
    renderer: Renderer, scenario: str
) -> None:
    manifests = renderer.render(SCENARIOS[scenario])
    leases = lease_role(manifests)
    for role, rule in rules_of(manifests):
        name = f"{role['kind']}/{role['metadata']['name']}"
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(key, []), f"{name} has a wildcard in {key}"
        if role is not leases:
            assert "leases" not in rule.get("resources", []), (
                f"{name} grants leases outside the release namespace"
            )
        assert "nonResourceURLs" not in rule
    assert grants(leases) == LEASE_NEEDS
    [binding] = [
        b for b in of_kind(manifests, "RoleBinding") if b["roleRef"]["name"] == leases["metadata"]["name"]
    ]
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [OPERATOR_SUBJECT]


def test_creating_configmaps_is_granted_only_when_transcripts_are_in_configmaps(renderer: Renderer) -> None:
    assert grants(one(renderer.render(), "ClusterRole"))[("", "configmaps")] == {"get"}
    configmaps = {"operator": {"transcriptStorage": "configmap"}}
    assert grants(one(renderer.render(configmaps), "ClusterRole")) == (
        CLUSTER_SCOPED_NEEDS | NAMESPACED_NEEDS | CONFIGMAP_NEEDS
    )
    for role in run_roles(renderer.render({**NAMESPACES_SCOPE, **configmaps})):
        assert grants(role) == NAMESPACED_NEEDS | CONFIGMAP_NEEDS


def test_patching_quota_status_is_granted_only_when_the_ledgers_are_in_postgres(renderer: Renderer) -> None:
    quota_status = ("agentrun.dev", "agentrunquotas/status")
    assert grants(one(renderer.render(), "ClusterRole"))[quota_status] == {"update"}
    ledgers = {"operator": {"quotaLedger": "postgres"}, "database": {"existingSecret": "db"}}
    assert grants(one(renderer.render(ledgers), "ClusterRole"))[quota_status] == {"update", "patch"}
    for role in run_roles(renderer.render({**NAMESPACES_SCOPE, **ledgers})):
        assert grants(role)[quota_status] == {"update", "patch"}


def test_service_account_is_created_with_its_token_mounted(renderer: Renderer) -> None:
    manifests = renderer.render()
    account = one(manifests, "ServiceAccount")
    assert account["metadata"] == account["metadata"] | {"name": OPERATOR_SA, "namespace": NAMESPACE}
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR_SA
    assert pod["automountServiceAccountToken"] is True


def test_namespaces_scope_without_namespaces_is_rejected(renderer: Renderer) -> None:
    proc = renderer.template({"rbac": {"scope": "namespaces"}}, check=False)
    assert proc.returncode != 0
    assert "watchNamespaces" in proc.stderr


def test_watch_namespaces_with_cluster_scope_is_rejected(renderer: Renderer) -> None:
    proc = renderer.template({"watchNamespaces": ["team-a"]}, check=False)
    assert proc.returncode != 0
    assert "watchNamespaces" in proc.stderr


# --- metrics, monitoring, network ---------------------------------------------------------------------


def test_metrics_service_exposes_the_operator_pod_metrics_port_named_http_metrics(renderer: Renderer) -> None:
    manifests = renderer.render()
    service = one(manifests, "Service")
    assert service["spec"]["ports"] == [
        {"name": "http-metrics", "port": 8080, "targetPort": "http-metrics", "protocol": "TCP"}
    ]
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p["containerPort"] for p in operator_container(manifests)["ports"]}
    assert ports["http-metrics"] == 8080


@pytest.mark.parametrize(
    ("enabled", "api_served", "rendered"),
    [(False, False, False), (True, False, False), (False, True, False), (True, True, True)],
)
def test_service_monitor_and_prometheus_rule_render_only_when_enabled_and_the_api_is_served(
    renderer: Renderer, enabled: bool, api_served: bool, rendered: bool
) -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": enabled}, "prometheusRule": {"enabled": enabled}}}
    manifests = renderer.render(values, api_versions=[MONITORING_API] if api_served else [])
    kinds = {m["kind"] for m in manifests if m["apiVersion"] == MONITORING_API}
    assert kinds == ({"ServiceMonitor", "PrometheusRule"} if rendered else set())


def test_service_monitor_scrapes_the_metrics_service(renderer: Renderer) -> None:
    manifests = renderer.render(EVERYTHING, api_versions=[MONITORING_API])
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["jobLabel"] in service["metadata"]["labels"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http-metrics"
    assert endpoint["path"] == "/metrics"
    # The runs' namespace label wins over the target's (what Prometheus then stores:
    # test_service_monitor_scrape.py).
    assert endpoint["honorLabels"] is True


def test_prometheus_rule_carries_the_groups_of_the_plain_rules_file(renderer: Renderer) -> None:
    rule = one(renderer.render(EVERYTHING, api_versions=[MONITORING_API]), "PrometheusRule")
    rules_file = yaml.safe_load((CHART / "rules" / "agentrun.rules.yaml").read_text())
    assert rule["spec"]["groups"] == rules_file["groups"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"


def test_dashboard_config_map_carries_the_sidecar_label_and_the_dashboard_json(renderer: Renderer) -> None:
    config_map = one(renderer.render(), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["agentrun.json"]) == json.loads(
        (CHART / "dashboards" / "agentrun.json").read_text()
    )
    moved = one(renderer.render(EVERYTHING), "ConfigMap")
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["annotations"] == {"grafana_folder": "Agents"}
    assert not of_kind(renderer.render({"metrics": {"dashboard": {"enabled": False}}}), "ConfigMap")


def test_network_policy_allows_dns_api_server_and_https_egress_and_only_metrics_ingress(
    renderer: Renderer,
) -> None:
    assert not of_kind(renderer.render(), "NetworkPolicy")
    manifests = renderer.render(EVERYTHING)
    policy = one(manifests, "NetworkPolicy")["spec"]
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    [ingress] = policy["ingress"]
    assert ingress["ports"] == [{"port": "http-metrics", "protocol": "TCP"}]
    assert ingress["from"] == EVERYTHING["networkPolicy"]["metricsFrom"]
    egress_ports = [{(p["port"], p["protocol"]) for p in rule["ports"]} for rule in policy["egress"]]
    assert {(53, "UDP"), (53, "TCP")} in egress_ports
    assert {(443, "TCP"), (6443, "TCP")} in egress_ports
    assert {(443, "TCP")} in egress_ports
    assert {(8443, "TCP")} in egress_ports
    api_rule = policy["egress"][egress_ports.index({(443, "TCP"), (6443, "TCP")})]
    assert api_rule["to"] == [{"ipBlock": {"cidr": "172.18.0.2/32"}}]


# --- values.yaml and values.schema.json ----------------------------------------------------------------


def load_schema() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text()))


def load_values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def compare(values: Any, schema: dict[str, Any], path: str) -> Iterator[str]:
    """Walks values.yaml and values.schema.json together; yields every key one has and the other lacks."""
    if not isinstance(values, dict) or "properties" not in schema:
        return  # a leaf, or a free-form map such as labels (described as a whole)
    properties = schema["properties"]
    for key, value in values.items():
        if key not in properties:
            yield f"{path}{key} is in values.yaml but not in values.schema.json"
            continue
        if not properties[key].get("description"):
            yield f"{path}{key} has no description in values.schema.json"
        yield from compare(value, properties[key], f"{path}{key}.")
    for key in properties:
        if key not in values:
            yield f"{path}{key} is in values.schema.json but has no default in values.yaml"


def test_values_schema_describes_every_key_of_values_yaml_and_nothing_else() -> None:
    problems = list(compare(load_values(), load_schema(), ""))
    assert not problems, "\n".join(problems)


def schema_nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "(root)", schema
    for key, sub in schema.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{key}" if path else key)
    if isinstance(schema.get("items"), dict):
        yield from schema_nodes(schema["items"], f"{path}[]")


def test_every_value_in_the_schema_has_a_type_and_a_description() -> None:
    for path, node in schema_nodes(load_schema()):
        assert node.get("description", "").strip(), f"{path} has no description"
        assert "type" in node or "enum" in node, f"{path} has no type"


def test_every_fixed_shape_object_in_the_schema_rejects_unknown_keys() -> None:
    for path, node in schema_nodes(load_schema()):
        if "properties" in node and node.get("type") == "object" and not path.endswith("[]"):
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"


def test_values_schema_rejects_unknown_keys_at_install_time(renderer: Renderer) -> None:
    proc = renderer.template({"metrics": {"serviceMonitor": {"enabeld": True}}}, check=False)
    assert proc.returncode != 0
    assert "enabeld" in proc.stderr


KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w./-]*):(?: |$)")


def test_every_key_in_values_yaml_has_a_comment_above_it() -> None:
    schema = load_schema()
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, dict[str, Any] | None]] = [(-1, schema)]
    undocumented = []
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        node = parent.get("properties", {}).get(match["key"]) if parent else None
        stack.append((indent, node))
        if parent is None or "properties" not in parent:
            continue  # an entry of a free-form map (e.g. a default label), not a chart value
        previous = lines[number - 1] if number else ""
        if not previous.strip().startswith("#"):
            undocumented.append(f"line {number + 1}: {line.strip()}")
    assert not undocumented, "keys without a comment above them:\n" + "\n".join(undocumented)


def test_values_yaml_holds_no_secrets() -> None:
    text = (CHART / "values.yaml").read_text()
    assert not re.search(r"sk-ant-|BEGIN [A-Z ]*PRIVATE KEY|password:\s*\S", text)
    api_key = load_values()["apiKey"]
    assert api_key == {"existingSecret": "", "key": "api-key"}


# --- the CRD -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("crd_file", CRD_FILES)
def test_chart_crd_copy_is_byte_identical_to_the_generated_crd(crd_file: str) -> None:
    generated = REPO / "crds" / crd_file
    copy = CHART / "crds" / crd_file
    assert generated.is_file(), f"{generated.relative_to(REPO)} is missing: run `make crds`"
    assert copy.is_file(), f"{copy.relative_to(REPO)} is missing: run `make crds`"
    assert copy.read_bytes() == generated.read_bytes(), f"{copy.relative_to(REPO)} differs: run `make crds`"


def test_crd_is_shipped_through_helms_crds_directory_and_not_templated() -> None:
    templates = CHART / "templates"
    for template in templates.iterdir():
        assert "CustomResourceDefinition" not in template.read_text(), template.name
