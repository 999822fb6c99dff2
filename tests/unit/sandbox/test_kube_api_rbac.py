"""What the emulator answers where kube-apiserver v1.36 was measured to answer differently before.

Every expected message below was read off a real v1.36 server (no kubelet) for the same requests:
impersonated requests authorized by the target's stored roles, constrained impersonation's wording,
``pods/log`` and ``pods/exec`` without a kubelet, and the graceful deletion of pods bound to a node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.rbac import BOOTSTRAP_RULES, Grant, Policy, Rule

RBAC = "/apis/rbac.authorization.k8s.io/v1"
PODS = "/api/v1/namespaces/default/pods"
SECRETS = "/api/v1/namespaces/default/secrets"
AGENT = "system:serviceaccount:default:agent"
AS_AGENT = {"Impersonate-User": AGENT}
BOT = "system:serviceaccount:ops:bot"
TOKEN = "bot-token"


def _binding(kind: str, name: str, role_kind: str, subjects: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": subjects,
    }


def _role(kind: str, name: str, *rules: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "rules": list(rules),
    }


def _pod(name: str, *containers: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": c, "image": "nginx"} for c in containers or ("app",)], **spec},
    }


@pytest.fixture
async def enforcing() -> AsyncIterator[EmulatedCluster]:
    async with EmulatedCluster.running() as kube:
        kube.emulator.authorize_impersonated_users = True
        yield kube


async def test_an_impersonated_request_may_do_what_the_stored_roles_of_its_target_allow(
    enforcing: EmulatedCluster,
) -> None:
    async with KubeClient(enforcing.url) as admin:
        reader = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
        agent = [{"kind": "ServiceAccount", "name": "agent", "namespace": "default"}]
        assert (
            await admin.post(f"{RBAC}/namespaces/default/roles", _role("Role", "pods", reader))
        ).status == 201
        binding = _binding("RoleBinding", "pods", "Role", agent)
        assert (await admin.post(f"{RBAC}/namespaces/default/rolebindings", binding)).status == 201

        assert (await admin.get(PODS, headers=AS_AGENT)).status == 200
        assert (await admin.get("/apis", headers=AS_AGENT)).status == 200  # discovery: every identity
        refused = await admin.get(SECRETS, headers=AS_AGENT)
        assert refused.status == 403
        assert refused.body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'secrets is forbidden: User "{AGENT}" cannot list resource "secrets" in API group "" '
            'in the namespace "default"',
            "reason": "Forbidden",
            "details": {"kind": "secrets"},
            "code": 403,
        }
        elsewhere = await admin.get("/api/v1/namespaces/kube-system/pods", headers=AS_AGENT)
        assert elsewhere.status == 403
        # The admin itself is never restricted, and a ClusterRole bound to a group reaches everywhere.
        assert (await admin.get(SECRETS)).status == 200
        secrets = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}
        accounts = [{"kind": "Group", "name": "system:serviceaccounts:default"}]
        assert (
            await admin.post(f"{RBAC}/clusterroles", _role("ClusterRole", "secrets", secrets))
        ).status == 201
        binding = _binding("ClusterRoleBinding", "secrets", "ClusterRole", accounts)
        assert (await admin.post(f"{RBAC}/clusterrolebindings", binding)).status == 201
        assert (await admin.get("/api/v1/namespaces/kube-system/secrets", headers=AS_AGENT)).status == 200


async def test_a_role_binding_to_a_cluster_role_grants_it_in_the_bindings_namespace_only(
    enforcing: EmulatedCluster,
) -> None:
    async with KubeClient(enforcing.url) as admin:
        rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}
        agent = [{"kind": "ServiceAccount", "name": "agent", "namespace": "default"}]
        assert (await admin.post(f"{RBAC}/clusterroles", _role("ClusterRole", "cm", rule))).status == 201
        binding = _binding("RoleBinding", "cm", "ClusterRole", agent)
        assert (await admin.post(f"{RBAC}/namespaces/default/rolebindings", binding)).status == 201
        assert (await admin.get("/api/v1/namespaces/default/configmaps", headers=AS_AGENT)).status == 200
        assert (await admin.get("/api/v1/namespaces/kube-system/configmaps", headers=AS_AGENT)).status == 403
        assert (await admin.get("/api/v1/configmaps", headers=AS_AGENT)).status == 403


async def test_without_the_switch_impersonated_requests_are_not_authorized_as_their_target() -> None:
    async with EmulatedCluster.running() as kube, KubeClient(kube.url) as admin:
        assert (await admin.get(SECRETS, headers=AS_AGENT)).status == 200


def _bot(*rules: Rule) -> Policy:
    return Policy(BOT, (*(Grant(rule) for rule in rules), *(Grant(rule) for rule in BOOTSTRAP_RULES)))


async def test_an_impersonator_without_rights_is_told_about_constrained_impersonation_first() -> None:
    # Granted the impersonate-on half of constrained impersonation only, not the identity half.
    on = Rule(("impersonate-on:serviceaccount:list", "impersonate-on:user-info:list"), ("",), ("pods",))
    async with (
        EmulatedCluster.running(rbac={TOKEN: _bot(on)}) as kube,
        KubeClient(kube.url, token=TOKEN) as bot,
    ):
        nothing = await bot.get(SECRETS, headers=AS_AGENT)
        assert nothing.status == 403
        assert nothing.body["message"] == (
            f'secrets is forbidden: User "{BOT}" cannot impersonate-on:serviceaccount:list resource '
            '"secrets" in API group "" in the namespace "default"'
        )
        half = await bot.get(PODS, headers=AS_AGENT)
        assert half.status == 403
        assert half.body["message"] == (
            f'serviceaccounts.authentication.k8s.io "agent" is forbidden: User "{BOT}" cannot '
            'impersonate:serviceaccount resource "serviceaccounts" in API group "authentication.k8s.io" '
            'in the namespace "default"'
        )
        assert half.body["details"] == {
            "name": "agent",
            "group": "authentication.k8s.io",
            "kind": "serviceaccounts",
        }
        as_jane = await bot.get(PODS, headers={"Impersonate-User": "jane", "Impersonate-Group": "devs"})
        assert as_jane.body["message"] == (
            f'users.authentication.k8s.io "jane" is forbidden: User "{BOT}" cannot impersonate:user-info '
            'resource "users" in API group "authentication.k8s.io" at the cluster scope'
        )
        # A service account with extra groups can only be impersonated the legacy way.
        grouped = await bot.get(PODS, headers={**AS_AGENT, "Impersonate-Group": "devs"})
        assert grouped.body["message"] == (
            f'serviceaccounts "agent" is forbidden: User "{BOT}" cannot impersonate resource '
            '"serviceaccounts" in API group "" in the namespace "default"'
        )


async def test_constrained_impersonation_with_both_halves_granted_is_allowed() -> None:
    on = Rule(("impersonate-on:serviceaccount:list",), ("",), ("pods",))
    identity = Rule(
        ("impersonate:serviceaccount",), ("authentication.k8s.io",), ("serviceaccounts",), ("agent",)
    )
    users = Rule(("impersonate:user-info",), ("authentication.k8s.io",), ("users",), ("jane",))
    user_on = Rule(("impersonate-on:user-info:list",), ("",), ("pods",))
    async with (
        EmulatedCluster.running(rbac={TOKEN: _bot(on, identity, users, user_on)}) as kube,
        KubeClient(kube.url, token=TOKEN) as bot,
    ):
        assert (await bot.get(PODS, headers=AS_AGENT)).status == 200
        assert (await bot.get(PODS, headers={"Impersonate-User": "jane"})).status == 200
        as_devs = await bot.get(PODS, headers={"Impersonate-User": "jane", "Impersonate-Group": "devs"})
        assert as_devs.body["message"] == (
            f'groups.authentication.k8s.io "devs" is forbidden: User "{BOT}" cannot impersonate:user-info '
            'resource "groups" in API group "authentication.k8s.io" at the cluster scope'
        )


async def test_once_legacy_impersonation_worked_a_refusal_names_the_legacy_check() -> None:
    legacy = Rule(("impersonate",), ("",), ("serviceaccounts",))
    policy = Policy(BOT, (Grant(legacy, namespace="default"), *(Grant(rule) for rule in BOOTSTRAP_RULES)))
    elsewhere = {"Impersonate-User": "system:serviceaccount:other:agent"}
    async with (
        EmulatedCluster.running(rbac={TOKEN: policy}) as kube,
        KubeClient(kube.url, token=TOKEN) as bot,
    ):
        first = await bot.get(PODS, headers=elsewhere)
        assert first.body["message"] == (
            f'pods is forbidden: User "{BOT}" cannot impersonate-on:serviceaccount:list resource "pods" '
            'in API group "" in the namespace "default"'
        )
        assert (await bot.get(PODS, headers=AS_AGENT)).status == 200
        later = await bot.get(PODS, headers=elsewhere)
        assert later.body["message"] == (
            f'serviceaccounts "agent" is forbidden: User "{BOT}" cannot impersonate resource '
            '"serviceaccounts" in API group "" in the namespace "other"'
        )


async def test_a_pod_log_names_its_container_and_there_is_none_without_a_kubelet(
    enforcing: EmulatedCluster,
) -> None:
    async with KubeClient(enforcing.url) as admin:
        assert (await admin.post(PODS, _pod("web"))).status == 201
        assert (
            await admin.post(PODS, _pod("multi", "a", "b", initContainers=[{"name": "init"}]))
        ).status == 201
        assert (await admin.post(PODS, _pod("bound", nodeName="node-a"))).status == 201

        unscheduled = await admin.get(f"{PODS}/web/log")
        assert (unscheduled.status, unscheduled.body) == (200, None)  # an empty body
        wrong = await admin.get(f"{PODS}/web/log", params={"container": "zz"})
        assert (wrong.status, wrong.body["message"]) == (400, "container zz is not valid for pod web")
        several = await admin.get(f"{PODS}/multi/log")
        assert several.status == 400
        assert (
            several.body["message"]
            == "a container name must be specified for pod multi, choose one of: [init a b]"
        )
        assert (await admin.get(f"{PODS}/multi/log", params={"container": "init"})).status == 200
        # Bound to a node no kubelet serves: the server looks the node up and says so, in its words.
        bound = await admin.get(f"{PODS}/bound/log")
        assert bound.status == 404
        assert (bound.body["message"], bound.body["details"]) == (
            'pods "node-a" not found',
            {"name": "node-a", "kind": "pods"},
        )
        # The emulator's kubelet stand-in serves a log once it has one.
        enforcing.emulator.set_pod_log("default", "bound", "hello\n")
        assert (await admin.get(f"{PODS}/bound/log")).body == "hello\n"


async def test_an_exec_names_its_container_and_a_pod_no_node_runs_has_no_host_to_exec_in(
    enforcing: EmulatedCluster,
) -> None:
    async with KubeClient(enforcing.url) as admin:
        assert (await admin.post(PODS, _pod("web"))).status == 201
        assert (
            await admin.post(PODS, _pod("multi", "a", "b", initContainers=[{"name": "init"}]))
        ).status == 201
        assert (await admin.post(PODS, _pod("bound", nodeName="node-a"))).status == 201
        command = {"command": "true", "stdout": "true"}

        for method in ("GET", "POST"):  # the websocket upgrade and SPDY
            unscheduled = await admin.request(method, f"{PODS}/web/exec", params=command)
            assert (unscheduled.status, unscheduled.body["reason"], unscheduled.body["message"]) == (
                400,
                "BadRequest",
                "pod web does not have a host assigned",
            )
        missing = await admin.get(f"{PODS}/nowhere/exec", params=command)
        assert (missing.status, missing.body["message"]) == (404, 'pods "nowhere" not found')
        wrong = await admin.get(f"{PODS}/web/exec", params={**command, "container": "zz"})
        assert (wrong.status, wrong.body["message"]) == (400, "container zz is not valid for pod web")
        several = await admin.get(f"{PODS}/multi/exec", params=command)
        assert (several.status, several.body["message"]) == (
            400,
            "a container name must be specified for pod multi, choose one of: [init a b]",
        )
        chosen = await admin.get(f"{PODS}/multi/exec", params={**command, "container": "a"})
        assert (chosen.status, chosen.body["message"]) == (400, "pod multi does not have a host assigned")
        # Bound to a node the emulator does not store: the server looks the node up and says so.
        bound = await admin.get(f"{PODS}/bound/exec", params=command)
        assert (bound.status, bound.body["message"], bound.body["details"]) == (
            404,
            'pods "node-a" not found',
            {"name": "node-a", "kind": "pods"},
        )
        assert (await admin.request("PUT", f"{PODS}/web/exec", json_body={})).status == 405


@pytest.mark.parametrize(
    ("verbs", "status", "message"),
    [
        (
            ["create"],
            403,
            f'pods "web" is forbidden: User "{AGENT}" cannot get resource "pods/exec" '
            'in API group "" in the namespace "default"',
        ),
        (["get"], 403, 'pods "web" is forbidden: '),  # the handler's own create check gives no reason
        (["get", "create"], 400, "pod web does not have a host assigned"),
    ],
)
async def test_an_exec_by_websocket_needs_get_and_create_on_pods_exec(
    enforcing: EmulatedCluster, verbs: list[str], status: int, message: str
) -> None:
    async with KubeClient(enforcing.url) as admin:
        assert (await admin.post(PODS, _pod("web"))).status == 201
        rule = {"apiGroups": [""], "resources": ["pods/exec"], "verbs": verbs}
        agent = [{"kind": "ServiceAccount", "name": "agent", "namespace": "default"}]
        assert (await admin.post(f"{RBAC}/namespaces/default/roles", _role("Role", "ex", rule))).status == 201
        binding = _binding("RoleBinding", "ex", "Role", agent)
        assert (await admin.post(f"{RBAC}/namespaces/default/rolebindings", binding)).status == 201

        answer = await admin.get(f"{PODS}/web/exec", params={"command": "true"}, headers=AS_AGENT)
        assert (answer.status, answer.body["message"]) == (status, message)
        # A pod that does not exist is not revealed to someone who may not exec.
        missing = await admin.get(f"{PODS}/nowhere/exec", params={"command": "true"}, headers=AS_AGENT)
        assert missing.status == (404 if status == 400 else 403)


async def test_a_pod_bound_to_a_node_stays_terminating_until_deleted_without_a_grace_period(
    enforcing: EmulatedCluster,
) -> None:
    async with KubeClient(enforcing.url) as admin:
        assert (await admin.post(PODS, _pod("bound", nodeName="node-a"))).status == 201
        assert (await admin.post(PODS, _pod("free"))).status == 201

        marked = await admin.delete(f"{PODS}/bound")
        assert marked.status == 200
        meta = marked.body["metadata"]
        assert (meta["deletionGracePeriodSeconds"], meta["generation"]) == (30, 2)
        assert meta["deletionTimestamp"] > meta["creationTimestamp"]
        again = await admin.delete(f"{PODS}/bound")
        assert again.body["metadata"]["resourceVersion"] == meta["resourceVersion"]  # nothing changed
        assert (await admin.get(f"{PODS}/bound")).status == 200

        assert (await admin.delete(f"{PODS}/bound", {"gracePeriodSeconds": 0})).status == 200
        assert (await admin.get(f"{PODS}/bound")).status == 404
        # A pod no node runs goes at once.
        assert (await admin.delete(f"{PODS}/free")).status == 200
        assert (await admin.get(f"{PODS}/free")).status == 404


async def test_a_self_subject_access_review_made_while_impersonating_answers_for_the_impersonated(
    enforcing: EmulatedCluster,
) -> None:
    """kube-apiserver answers `kubectl auth can-i --as=X` for X (its stored roles), not for the caller."""
    ssar = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"

    def review(verb: str, resource: str) -> dict[str, Any]:
        attributes = {"verb": verb, "resource": resource, "namespace": "default"}
        return {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }

    async with KubeClient(enforcing.url) as admin:
        reader = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
        agent = [{"kind": "ServiceAccount", "name": "agent", "namespace": "default"}]
        await admin.post(f"{RBAC}/namespaces/default/roles", _role("Role", "pods", reader))
        await admin.post(
            f"{RBAC}/namespaces/default/rolebindings", _binding("RoleBinding", "pods", "Role", agent)
        )
        pods = await admin.post(ssar, review("list", "pods"), headers=AS_AGENT)
        secrets = await admin.post(ssar, review("list", "secrets"), headers=AS_AGENT)
        mine = await admin.post(ssar, review("list", "secrets"))
    assert (pods.status, pods.body["status"]) == (201, {"allowed": True})
    assert secrets.body["status"] == {"allowed": False}
    assert mine.body["status"] == {"allowed": True}  # the admin, not impersonating
