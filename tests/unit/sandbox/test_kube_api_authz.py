"""Optional RBAC enforcement in the emulator: one identity restricted, the admin token unrestricted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import CONFIGMAPS, WIDGETS, WIDGETS_CRD, widget
from tests.support.rbac import BOOTSTRAP_RULES, Grant, Policy, Rule

BOT = "system:serviceaccount:ops:bot"
TOKEN = "bot-token"


@pytest.fixture
async def guarded() -> AsyncIterator[EmulatedCluster]:
    rules = Policy(
        BOT,
        (
            Grant(Rule(("get", "list", "create"), ("",), ("configmaps",)), namespace="default"),
            Grant(Rule(("get",), ("test.agentrun.dev",), ("widgets",))),
            Grant(Rule(("impersonate",), ("",), ("serviceaccounts",), ("agent",))),
            *(Grant(rule) for rule in BOOTSTRAP_RULES),
        ),
    )
    async with EmulatedCluster.running(crd_paths=[WIDGETS_CRD], rbac={TOKEN: rules}) as kube:
        yield kube


async def test_a_request_the_rules_do_not_allow_gets_the_servers_forbidden_status(
    guarded: EmulatedCluster,
) -> None:
    async with KubeClient(guarded.url) as admin, KubeClient(guarded.url, token=TOKEN) as bot:
        assert (await admin.post(WIDGETS, widget("w1"))).status == 201
        assert (await bot.get(f"{WIDGETS}/w1")).status == 200
        answer = await bot.patch(f"{WIDGETS}/w1", {"spec": {"size": 5}})
        assert answer.status == 403
        assert answer.body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'widgets.test.agentrun.dev "w1" is forbidden: User "system:serviceaccount:ops:bot" '
            'cannot patch resource "widgets" in API group "test.agentrun.dev" in the namespace "default"',
            "reason": "Forbidden",
            "details": {"name": "w1", "group": "test.agentrun.dev", "kind": "widgets"},
            "code": 403,
        }
        # Refused before any state change; the admin token is never restricted.
        assert (await admin.get(f"{WIDGETS}/w1")).body["spec"]["size"] == 3
        assert (await admin.patch(f"{WIDGETS}/w1", {"spec": {"size": 5}})).status == 200


async def test_a_role_binding_does_not_reach_other_namespaces_or_the_cluster_scope(
    guarded: EmulatedCluster,
) -> None:
    async with KubeClient(guarded.url, token=TOKEN) as bot:
        assert (await bot.get(CONFIGMAPS)).status == 200
        everywhere = await bot.get("/api/v1/configmaps")
        assert everywhere.status == 403
        assert everywhere.body["message"] == (
            'configmaps is forbidden: User "system:serviceaccount:ops:bot" cannot list resource '
            '"configmaps" in API group "" at the cluster scope'
        )
        assert (await bot.get("/api/v1/namespaces/kube-system/configmaps")).status == 403
        # Discovery and /version are open to every authenticated identity.
        assert (await bot.get("/apis")).status == 200
        assert (await bot.get("/version")).status == 200
    checked = [(d.record.path, d.allowed) for d in guarded.emulator.decisions]
    assert ("/api/v1/configmaps", False) in checked and (CONFIGMAPS, True) in checked


async def test_impersonation_is_checked_against_the_service_account_named(guarded: EmulatedCluster) -> None:
    async with KubeClient(guarded.url, token=TOKEN) as bot:
        as_agent = {"Impersonate-User": "system:serviceaccount:default:agent"}
        # The impersonated request itself runs as the service account (not authorized here).
        assert (await bot.get("/api/v1/namespaces/default/secrets", headers=as_agent)).status == 200
        as_admin = {"Impersonate-User": "system:serviceaccount:default:admin"}
        refused = await bot.get("/api/v1/namespaces/default/secrets", headers=as_admin)
        assert refused.status == 403
        assert refused.body["message"] == (
            'serviceaccounts "admin" is forbidden: User "system:serviceaccount:ops:bot" cannot impersonate '
            'resource "serviceaccounts" in API group "" in the namespace "default"'
        )
        as_user = await bot.get(CONFIGMAPS, headers={"Impersonate-User": "jane"})
        assert as_user.status == 403
        assert 'cannot impersonate resource "users"' in as_user.body["message"]


async def test_blocking_owner_deletion_needs_update_on_the_owners_finalizers(
    guarded: EmulatedCluster,
) -> None:
    async with KubeClient(guarded.url) as admin, KubeClient(guarded.url, token=TOKEN) as bot:
        owner = (await admin.post(WIDGETS, widget("owner"))).body
        ref = {
            "apiVersion": "test.agentrun.dev/v1",
            "kind": "Widget",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
        }
        plain = {"metadata": {"name": "plain", "ownerReferences": [ref]}, "data": {}}
        assert (await bot.post(CONFIGMAPS, plain)).status == 201
        blocking = {
            "metadata": {"name": "blocking", "ownerReferences": [{**ref, "blockOwnerDeletion": True}]}
        }
        answer = await bot.post(CONFIGMAPS, blocking)
        assert answer.status == 403
        assert (
            'cannot update resource "widgets/finalizers" in API group "test.agentrun.dev"'
            in (answer.body["message"])
        )


SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def _review(**attributes: str) -> dict[str, object]:
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }


async def test_a_self_subject_access_review_answers_with_the_tokens_own_rules(
    guarded: EmulatedCluster,
) -> None:
    """`kubectl auth can-i`, as kube-apiserver v1.36 answers it: 201, the spec back, status.allowed."""
    async with KubeClient(guarded.url, token=TOKEN) as bot, KubeClient(guarded.url) as admin:
        mine = await bot.post(SSAR, _review(verb="list", resource="configmaps", namespace="default"))
        assert (mine.status, mine.body["status"]) == (201, {"allowed": True})
        assert mine.body["spec"] == {
            "resourceAttributes": {"verb": "list", "resource": "configmaps", "namespace": "default"}
        }
        cluster_wide = await bot.post(SSAR, _review(verb="list", resource="namespaces"))
        assert (cluster_wide.status, cluster_wide.body["status"]) == (201, {"allowed": False})
        widgets = await bot.post(SSAR, _review(verb="get", group="test.agentrun.dev", resource="widgets"))
        assert widgets.body["status"] == {"allowed": True}
        # The admin token is unrestricted, so the answer for it is yes.
        assert (await admin.post(SSAR, _review(verb="list", resource="namespaces"))).body["status"] == {
            "allowed": True
        }
        empty = await bot.post(
            SSAR, {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview"}
        )
        assert empty.status == 422
        assert "exactly one of nonResourceAttributes or resourceAttributes" in empty.body["message"]
