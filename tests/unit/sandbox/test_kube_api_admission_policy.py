"""ValidatingAdmissionPolicy in the emulator, answering as kube-apiserver v1.36 does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.kube.authz import UserInfo
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import WIDGETS, WIDGETS_CRD, widget

API = "/apis/admissionregistration.k8s.io/v1"
POLICIES = f"{API}/validatingadmissionpolicies"
BINDINGS = f"{API}/validatingadmissionpolicybindings"
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
ALICE = "alice-token"
NOTE_IS_THE_WRITER = "!has(object.spec.note) || object.spec.note == request.userInfo.username"


def policy(
    name: str = "note-guard",
    *validations: dict[str, Any],
    resources: tuple[str, ...] = ("widgets",),
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["test.agentrun.dev"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": list(resources),
                    }
                ]
            },
            "validations": list(validations) or [{"expression": NOTE_IS_THE_WRITER, "reason": "Forbidden"}],
            **spec,
        },
    }


def binding(name: str = "note-guard", policy_name: str = "note-guard", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"], **spec},
    }


@pytest.fixture
async def kube() -> AsyncIterator[EmulatedCluster]:
    async with EmulatedCluster.running(
        crd_paths=[WIDGETS_CRD], identities={ALICE: UserInfo("alice")}
    ) as kube:
        yield kube


async def install(client: KubeClient, *objects: dict[str, Any]) -> None:
    for obj in objects:
        path = POLICIES if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
        answer = await client.post(path, obj)
        assert answer.status == 201, answer.body


async def test_a_failed_validation_denies_with_the_servers_forbidden_status(client: KubeClient) -> None:
    await install(client, policy(), binding())
    answer = await client.post(WIDGETS, widget("w1", note="mallory"))
    message = (
        "ValidatingAdmissionPolicy 'note-guard' with binding 'note-guard' denied request: "
        f"failed expression: {NOTE_IS_THE_WRITER}"
    )
    assert (answer.status, answer.body) == (
        403,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'widgets.test.agentrun.dev "w1" is forbidden: {message}',
            "reason": "Forbidden",
            "details": {
                "name": "w1",
                "group": "test.agentrun.dev",
                "kind": "widgets",
                "causes": [{"message": message}],
            },
            "code": 403,
        },
    )
    assert (await client.get(f"{WIDGETS}/w1")).status == 404  # refused before anything was stored
    assert (await client.post(WIDGETS, widget("w1", note="kube-emulator"))).status == 201


async def test_request_user_info_is_the_tokens_identity_or_the_impersonated_user(
    kube: EmulatedCluster,
) -> None:
    async with KubeClient(kube.url) as admin, KubeClient(kube.url, token=ALICE) as alice:
        await install(admin, policy(), binding())
        assert (await alice.post(WIDGETS, widget("w1", note="alice"))).status == 201
        assert (await alice.patch(f"{WIDGETS}/w1", {"spec": {"note": "kube-emulator"}})).status == 403
        as_bob = {"Impersonate-User": "bob", "Impersonate-Group": "team"}
        assert (await admin.patch(f"{WIDGETS}/w1", {"spec": {"note": "bob"}}, headers=as_bob)).status == 200
        assert (await admin.patch(f"{WIDGETS}/w1", {"spec": {"note": "alice"}}, headers=as_bob)).status == 403


async def test_the_message_comes_from_message_expression_then_message_and_reason_sets_the_code(
    client: KubeClient,
) -> None:
    checks = policy(
        "checks",
        {
            "expression": "object.spec.size < 9",
            "messageExpression": "'size ' + string(object.spec.size) + ' is too big'",
            "message": "not shown",
        },
        {"expression": "object.spec.size < 8", "message": "size must stay below 8"},
    )
    await install(client, checks, binding("checks", "checks"))
    answer = await client.post(WIDGETS, widget("w1", size=9))
    assert (answer.status, answer.body["reason"]) == (422, "Invalid")  # no reason: Invalid, 422
    assert answer.body["message"].endswith("denied request: size 9 is too big")
    answer = await client.post(WIDGETS, widget("w1", size=8))
    assert answer.body["message"].endswith("denied request: size must stay below 8")


async def test_updates_see_the_old_object_and_creates_a_null_one(client: KubeClient) -> None:
    grows = {
        "expression": "request.operation == 'CREATE' ? oldObject == null"
        " : object.spec.size >= oldObject.spec.size",
        "message": "a widget never shrinks",
    }
    await install(client, policy("grows", grows), binding("grows", "grows"))
    assert (await client.post(WIDGETS, widget("w1", size=4))).status == 201
    assert (await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 5}})).status == 200
    shrunk = await client.patch(f"{WIDGETS}/w1", {"spec": {"size": 2}})
    assert (shrunk.status, shrunk.body["message"].rsplit(": ", 1)[-1]) == (422, "a widget never shrinks")


async def test_variables_are_evaluated_on_use_and_can_build_on_each_other(client: KubeClient) -> None:
    tagged = policy(
        "tags",
        {
            "expression": "size(variables.untagged) == 0",
            "messageExpression": "'tag ' + variables.untagged[0] + ' lacks the prefix'",
        },
        variables=[
            {"name": "tags", "expression": "has(object.spec.tags) ? object.spec.tags : []"},
            {"name": "untagged", "expression": "variables.tags.filter(t, !t.startsWith('x-'))"},
        ],
    )
    await install(client, tagged, binding("tags", "tags"))
    assert (await client.post(WIDGETS, widget("w1", tags=["x-a", "x-b"]))).status == 201
    answer = await client.post(WIDGETS, widget("w2", tags=["x-a", "b"]))
    assert answer.body["message"].endswith("denied request: tag b lacks the prefix")


async def test_bindings_select_namespaces_by_their_labels_and_objects_by_theirs(client: KubeClient) -> None:
    only_other = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}
    await install(client, policy(), binding(matchResources=only_other))
    assert (await client.post(WIDGETS, widget("w1", note="mallory"))).status == 201  # default: not bound
    labelled = {"objectSelector": {"matchExpressions": [{"key": "guarded", "operator": "Exists"}]}}
    await install(client, binding("by-label", matchResources=labelled))
    plain = widget("w2", note="mallory")
    assert (await client.post(WIDGETS, plain)).status == 201
    guarded = {**plain, "metadata": {"name": "w3", "labels": {"guarded": "yes"}}}
    assert (await client.post(WIDGETS, guarded)).status == 403


async def test_excluded_resources_and_subresources_are_not_matched_unless_named(client: KubeClient) -> None:
    status_guard = {"expression": "!has(object.status) || object.status.phase != 'Broken'"}
    await install(client, policy("main", status_guard), binding("main", "main"))
    await client.post(WIDGETS, widget("w1"))
    broken = {"status": {"phase": "Broken"}}
    assert (
        await client.patch(f"{WIDGETS}/w1/status", broken)
    ).status == 200  # "widgets" is not widgets/status
    await install(
        client, policy("status", status_guard, resources=("widgets/status",)), binding("s", "status")
    )
    assert (
        await client.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Broken", "iterations": 1}})
    ).status == 422
    excluded = policy("excluded", {"expression": "false"})
    excluded["spec"]["matchConstraints"]["excludeResourceRules"] = excluded["spec"]["matchConstraints"][
        "resourceRules"
    ]
    await install(client, excluded, binding("excluded", "excluded"))
    assert (await client.post(WIDGETS, widget("w2"))).status == 201


async def test_warn_actions_admit_with_a_warning_header(client: KubeClient) -> None:
    await install(client, policy(), binding(validationActions=["Warn"]))
    answer = await client.post(WIDGETS, widget("w1", note="mallory"))
    assert answer.status == 201
    assert answer.warnings == [
        "299 - \"Validation failed for ValidatingAdmissionPolicy 'note-guard' with binding 'note-guard': "
        f'failed expression: {NOTE_IS_THE_WRITER}"'
    ]


@pytest.mark.parametrize(("failure_policy", "status"), [("Fail", 422), ("Ignore", 201)])
async def test_evaluation_errors_deny_only_under_failure_policy_fail(
    client: KubeClient, failure_policy: str, status: int
) -> None:
    erring = policy("erring", {"expression": "object.spec.limit > 0"}, failurePolicy=failure_policy)
    await install(client, erring, binding("erring", "erring"))
    answer = await client.post(WIDGETS, widget("w1"))  # no limit: selecting it is an error
    assert answer.status == status
    if status == 422:
        assert (
            "expression 'object.spec.limit > 0' resulted in error: no such key: limit"
            in answer.body["message"]
        )


async def test_an_expression_the_emulator_cannot_evaluate_denies_instead_of_passing_silently(
    client: KubeClient,
) -> None:
    await install(
        client, policy("odd", {"expression": "object.spec.task.lowerAscii() == 'build'"}), binding("o", "odd")
    )
    answer = await client.post(WIDGETS, widget("w1"))
    assert answer.status == 422
    assert "the kube emulator cannot evaluate" in answer.body["message"]


async def test_policies_are_stored_with_the_servers_defaults(client: KubeClient) -> None:
    stored = await client.post(POLICIES, policy())
    assert stored.body["spec"]["failurePolicy"] == "Fail"
    constraints = stored.body["spec"]["matchConstraints"]
    assert (constraints["namespaceSelector"], constraints["objectSelector"]) == ({}, {})
    assert constraints["matchPolicy"] == "Equivalent"
    assert constraints["resourceRules"][0]["scope"] == "*"


async def test_policies_and_bindings_without_their_required_fields_are_invalid(client: KubeClient) -> None:
    answer = await client.post(POLICIES, {"metadata": {"name": "bad"}, "spec": {}})
    assert (answer.status, answer.body["message"]) == (
        422,
        'ValidatingAdmissionPolicy.admissionregistration.k8s.io "bad" is invalid: [spec.matchConstraints: '
        "Required value, spec.validations: Required value: validations or auditAnnotations must contain at "
        "least one item, spec.auditAnnotations: Required value: validations or auditAnnotations must contain "
        "at least one item]",
    )
    answer = await client.post(BINDINGS, {"metadata": {"name": "bad"}, "spec": {}})
    assert answer.body["message"] == (
        'ValidatingAdmissionPolicyBinding.admissionregistration.k8s.io "bad" is invalid: [spec.policyName: '
        "Required value, spec.validationActions: Required value: at least one validation action is required]"
    )


async def test_a_self_subject_review_names_the_caller_as_kubectl_auth_whoami_shows_it(
    kube: EmulatedCluster,
) -> None:
    async with KubeClient(kube.url) as admin, KubeClient(kube.url, token=ALICE) as alice:
        review = await admin.post(
            WHOAMI, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        assert review.status == 201
        assert review.body["status"] == {
            "userInfo": {"username": "kube-emulator", "groups": ["system:masters", "system:authenticated"]}
        }
        assert review.body["kind"] == "SelfSubjectReview" and review.body["metadata"]["creationTimestamp"]
        assert (await alice.post(WHOAMI, {})).body["status"]["userInfo"]["username"] == "alice"
        sa = "system:serviceaccount:team:bot"
        as_sa = await admin.post(WHOAMI, {}, headers={"Impersonate-User": sa})
        assert as_sa.body["status"]["userInfo"] == {
            "username": sa,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"],
        }
        assert (await admin.get(WHOAMI)).status == 405  # create is its only verb


async def test_namespaces_carry_the_name_label_selectors_rely_on(client: KubeClient) -> None:
    created = await client.post("/api/v1/namespaces", {"metadata": {"name": "team", "labels": {"a": "b"}}})
    assert created.body["metadata"]["labels"] == {"a": "b", "kubernetes.io/metadata.name": "team"}
    patched = await client.patch("/api/v1/namespaces/team", {"metadata": {"labels": None}})
    assert patched.body["metadata"]["labels"] == {"kubernetes.io/metadata.name": "team"}
    default = await client.get("/api/v1/namespaces/default")
    assert default.body["metadata"]["labels"] == {"kubernetes.io/metadata.name": "default"}
