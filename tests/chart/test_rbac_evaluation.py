"""The RBAC evaluator of tests/support/rbac.py follows Kubernetes' rule semantics, and the chart's policy."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.kube.authz import Attributes
from tests.support.kube_client import KubeClient
from tests.support.rbac import (
    OPERATOR_USER,
    Grant,
    Policy,
    Rule,
    SessionRecord,
    chart_policy,
    policy_from_manifests,
)

USER = "system:serviceaccount:ops:bot"


def ask(
    verb: str,
    resource: str = "",
    *,
    group: str = "",
    sub: str = "",
    ns: str = "",
    name: str = "",
    path: str = "",
    user: str = USER,
) -> Attributes:
    if path:
        return Attributes(user, verb, False, path=path)
    return Attributes(user, verb, True, group, resource, sub, ns, name)


def policy(*grants: Grant) -> Policy:
    return Policy(USER, grants)


def test_a_rule_matches_only_its_verbs_groups_and_resources() -> None:
    p = policy(Grant(Rule(("get", "list"), ("agentrun.dev",), ("agentruns",))))
    assert p.allows(ask("get", "agentruns", group="agentrun.dev", ns="a", name="x"))
    assert p.allows(ask("list", "agentruns", group="agentrun.dev"))
    assert not p.allows(ask("delete", "agentruns", group="agentrun.dev", ns="a", name="x"))
    assert not p.allows(ask("get", "agentruns", group="other.dev", ns="a", name="x"))
    assert not p.allows(ask("get", "secrets", ns="a", name="x"))


def test_wildcards_match_any_verb_group_and_resource_but_not_other_users() -> None:
    p = policy(Grant(Rule(("*",), ("*",), ("*",))))
    assert p.allows(ask("impersonate", "serviceaccounts", ns="a", name="x"))
    assert p.allows(ask("patch", "agentruns", group="agentrun.dev", sub="status", ns="a", name="x"))
    assert not p.allows(ask("get", "pods", ns="a", name="x", user="system:serviceaccount:ops:other"))


def test_a_subresource_needs_its_own_rule_or_a_star_slash_rule() -> None:
    main_only = policy(Grant(Rule(("patch",), ("agentrun.dev",), ("agentruns",))))
    status = ask("patch", "agentruns", group="agentrun.dev", sub="status", ns="a", name="x")
    assert not main_only.allows(status)
    assert policy(Grant(Rule(("patch",), ("agentrun.dev",), ("agentruns/status",)))).allows(status)
    assert policy(Grant(Rule(("patch",), ("agentrun.dev",), ("*/status",)))).allows(status)
    assert not policy(Grant(Rule(("patch",), ("agentrun.dev",), ("*/scale",)))).allows(status)
    # A subresource rule does not grant the main resource.
    sub_only = policy(Grant(Rule(("patch",), ("agentrun.dev",), ("agentruns/status",))))
    assert not sub_only.allows(ask("patch", "agentruns", group="agentrun.dev", ns="a", name="x"))


def test_resource_names_restrict_named_requests_and_never_match_unnamed_ones() -> None:
    p = policy(Grant(Rule(("get", "list", "impersonate"), ("",), ("serviceaccounts",), ("agent",))))
    assert p.allows(ask("impersonate", "serviceaccounts", ns="a", name="agent"))
    assert not p.allows(ask("impersonate", "serviceaccounts", ns="a", name="admin"))
    assert not p.allows(ask("list", "serviceaccounts", ns="a"))


def test_a_role_binding_grants_only_inside_its_namespace() -> None:
    p = policy(Grant(Rule(("get", "list"), ("",), ("secrets",)), namespace="team-a"))
    assert p.allows(ask("get", "secrets", ns="team-a", name="key"))
    assert not p.allows(ask("get", "secrets", ns="team-b", name="key"))
    assert not p.allows(ask("list", "secrets"))  # all namespaces is the cluster scope


def test_a_cluster_role_binding_grants_in_every_namespace_and_at_the_cluster_scope() -> None:
    p = policy(Grant(Rule(("list",), ("",), ("secrets",))))
    assert p.allows(ask("list", "secrets", ns="anywhere"))
    assert p.allows(ask("list", "secrets"))


def test_non_resource_urls_match_exactly_or_by_prefix_and_only_cluster_wide() -> None:
    p = policy(Grant(Rule(("get",), non_resource_urls=("/metrics", "/apis/*"))))
    assert p.allows(ask("get", path="/metrics"))
    assert p.allows(ask("get", path="/apis/agentrun.dev/v1alpha1"))
    assert not p.allows(ask("get", path="/metricsz"))
    assert not p.allows(ask("post", path="/metrics"))
    assert not p.allows(ask("get", "metrics", ns="a"))  # a resource request is not a path


def binding(kind: str, role_kind: str, subjects: list[dict[str, Any]], namespace: str | None = None) -> Any:
    meta: dict[str, Any] = {"name": f"b-{role_kind.lower()}"}
    if namespace:
        meta["namespace"] = namespace
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"kind": role_kind, "name": "r"},
        "subjects": subjects,
    }


def test_effective_rules_come_from_bindings_whose_subjects_include_the_user() -> None:
    cluster_role = {
        "kind": "ClusterRole",
        "metadata": {"name": "r"},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
        ],
    }
    role = {
        "kind": "Role",
        "metadata": {"name": "r", "namespace": "b"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    sa = {"kind": "ServiceAccount", "name": "bot", "namespace": "ops"}
    other = {"kind": "ServiceAccount", "name": "bot", "namespace": "elsewhere"}
    manifests = [
        cluster_role,
        role,
        # A RoleBinding to a ClusterRole: its rules, but only in namespace a (and no URLs).
        binding("RoleBinding", "ClusterRole", [sa], "a"),
        binding("RoleBinding", "Role", [{"kind": "Group", "name": "system:serviceaccounts:ops"}], "b"),
        binding("ClusterRoleBinding", "ClusterRole", [other]),
    ]
    p = policy_from_manifests(manifests, USER)
    assert p.allows(ask("get", "configmaps", ns="a", name="x"))
    assert not p.allows(ask("get", "configmaps", ns="b", name="x"))
    assert p.allows(ask("get", "secrets", ns="b", name="x"))
    assert not p.allows(ask("get", "secrets", ns="a", name="x"))
    assert not p.allows(ask("get", path="/metrics"))
    # Every authenticated identity may read discovery and /version (the bootstrap policy).
    assert p.allows(ask("get", path="/apis/agentrun.dev/v1alpha1"))
    assert p.allows(ask("get", path="/version"))


def test_unused_lists_each_chart_permission_no_question_needed() -> None:
    p = policy(Grant(Rule(("get", "delete"), ("",), ("secrets", "configmaps"), source="Role/r"), "a"))
    unused = {str(x) for x in p.unused([ask("get", "secrets", ns="a", name="k")])}
    assert unused == {
        "Role/r: delete secrets in API group ''",
        "Role/r: get configmaps in API group ''",
        "Role/r: delete configmaps in API group ''",
    }
    # Used in another namespace does not count: that Role does not apply there.
    assert len(p.unused([ask("get", "secrets", ns="b", name="k")])) == 4


@pytest.mark.parametrize("scope", ["cluster", "namespaces"])
def test_the_chart_never_lets_the_operator_impersonate_users_or_groups(scope: str) -> None:
    p = chart_policy(scope, ["team-a"])
    assert p.allows(ask("impersonate", "serviceaccounts", ns="team-a", name="agent", user=OPERATOR_USER))
    assert not p.allows(ask("impersonate", "users", name="admin", user=OPERATOR_USER))
    assert not p.allows(ask("impersonate", "groups", name="system:masters", user=OPERATOR_USER))
    # Service accounts of namespaces it does not watch only with scope "cluster".
    outside = ask("impersonate", "serviceaccounts", ns="kube-system", name="x", user=OPERATOR_USER)
    assert p.allows(outside) == (scope == "cluster")


def test_namespaces_scope_keeps_secrets_and_runs_inside_the_watched_namespaces() -> None:
    p = chart_policy("namespaces", ["team-a", "team-b"])
    for ns in ("team-a", "team-b"):
        assert p.allows(ask("get", "secrets", ns=ns, name="key", user=OPERATOR_USER))
        assert p.allows(ask("watch", "agentruns", group="agentrun.dev", ns=ns, user=OPERATOR_USER))
    assert not p.allows(ask("get", "secrets", ns="default", name="key", user=OPERATOR_USER))
    assert not p.allows(ask("watch", "agentruns", group="agentrun.dev", user=OPERATOR_USER))
    assert p.allows(
        ask("watch", "customresourcedefinitions", group="apiextensions.k8s.io", user=OPERATOR_USER)
    )


def test_impersonation_can_be_limited_to_named_service_accounts() -> None:
    p = chart_policy(
        "cluster", values={"rbac": {"scope": "cluster", "impersonationServiceAccountNames": ["agent"]}}
    )
    assert p.allows(ask("impersonate", "serviceaccounts", ns="x", name="agent", user=OPERATOR_USER))
    assert not p.allows(ask("impersonate", "serviceaccounts", ns="x", name="admin", user=OPERATOR_USER))


async def test_the_session_record_keeps_only_operator_requests_and_reports_what_the_chart_refuses() -> None:
    record = SessionRecord()
    EmulatedCluster.stopped_hooks.append(record.collect)
    try:
        async with EmulatedCluster.running() as kube:
            kopf = {"User-Agent": "kopf/1.45.2"}
            async with KubeClient(kube.url, headers=kopf) as operator, KubeClient(kube.url) as tests:
                await operator.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
                # A namespaced operator (no cluster-wide AgentRun watch) watches namespaces: allowed
                # by the "namespaces" scope it ran in, though the "cluster" scope does not grant it.
                await operator.get("/api/v1/namespaces")
                await operator.get("/apis/agentrun.dev/v1alpha1/namespaces/default/agentruns")
                await operator.get("/api/v1/namespaces/default/configmaps")  # not granted
                await tests.get("/api/v1/namespaces/default/pods")  # the tests' own client: ignored
                as_agent = {"Impersonate-User": "system:serviceaccount:default:agent"}
                await tests.get("/api/v1/namespaces/default/pods", headers=as_agent)  # the tools: counted
    finally:
        EmulatedCluster.stopped_hooks.remove(record.collect)
    assert {(q.verb, q.rbac_resource) for q, _ in record.questions} == {
        ("list", "customresourcedefinitions"),
        ("list", "namespaces"),
        ("list", "agentruns"),
        ("list", "configmaps"),
        ("impersonate", "serviceaccounts"),
    }
    assert record.refusals() == [
        '[cluster] GET /api/v1/namespaces/default/configmaps: User "system:serviceaccount:agentrun-system:'
        'agentrun-operator" cannot list resource "configmaps" in API group "" in the namespace "default"',
        '[namespaces] GET /api/v1/namespaces/default/configmaps: User "system:serviceaccount:agentrun-system:'
        'agentrun-operator" cannot list resource "configmaps" in API group "" in the namespace "default"',
    ]
