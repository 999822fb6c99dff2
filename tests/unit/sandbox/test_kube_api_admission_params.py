"""ValidatingAdmissionPolicy parameters (paramKind, paramRef) in the emulator, as kube-apiserver v1.36
answers them (each behaviour was checked against a real v1.36 server first)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from agentrun_sandbox.kube.cel import compile_expression
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import CONFIGMAPS, WIDGETS, WIDGETS_CRD, widget
from tests.unit.sandbox.test_kube_api_admission_policy import BINDINGS, binding, install, policy

OTHER_CONFIGMAPS = "/api/v1/namespaces/other/configmaps"
OTHER_WIDGETS = WIDGETS.replace("/default/", "/other/")
NOTE_NOT_FORBIDDEN = {
    "expression": "!has(object.spec.note) || object.spec.note != params.data.forbidden",
    "reason": "Forbidden",
    "messageExpression": "'configmap ' + params.metadata.name + ' forbids ' + object.spec.note",
}
CONFIGMAP_PARAMS = {"apiVersion": "v1", "kind": "ConfigMap"}
LIMITS = {"selector": {"matchLabels": {"role": "limit"}}, "parameterNotFoundAction": "Allow"}


def limit(name: str, forbidden: str, *, labelled: bool = True) -> dict[str, Any]:
    labels = {"role": "limit"} if labelled else {}
    return {"metadata": {"name": name, "labels": labels}, "data": {"forbidden": forbidden}}


def guard(**spec: Any) -> dict[str, Any]:
    return policy("guard", NOTE_NOT_FORBIDDEN, paramKind=CONFIGMAP_PARAMS, **spec)


def denial(answer: Any) -> str:
    return str(answer.body["message"]).partition("denied request: ")[2]


@pytest.fixture
async def kube() -> AsyncIterator[EmulatedCluster]:
    async with EmulatedCluster.running(crd_paths=[WIDGETS_CRD]) as kube:
        yield kube


@pytest.fixture
async def with_other_namespace(client: KubeClient) -> None:
    answer = await client.post("/api/v1/namespaces", {"metadata": {"name": "other"}})
    assert answer.status == 201, answer.body


async def test_every_parameter_the_selector_finds_is_checked_and_the_first_refusal_in_name_order_answers(
    client: KubeClient,
) -> None:
    await install(client, guard(), binding("guard", "guard", paramRef=LIMITS))
    for name, forbidden in (("b-limit", "mallory"), ("a-limit", "eve"), ("c-limit", "mallory")):
        assert (await client.post(CONFIGMAPS, limit(name, forbidden))).status == 201
    assert (await client.post(CONFIGMAPS, limit("unlabelled", "alice", labelled=False))).status == 201

    refused = await client.post(WIDGETS, widget("w1", note="mallory"))
    assert refused.status == 403
    assert denial(refused) == "configmap b-limit forbids mallory"
    assert denial(await client.post(WIDGETS, widget("w2", note="eve"))) == "configmap a-limit forbids eve"
    # A ConfigMap the selector does not match is no parameter.
    assert (await client.post(WIDGETS, widget("w3", note="alice"))).status == 201


@pytest.mark.usefixtures("with_other_namespace")
async def test_namespaced_parameters_come_from_the_requests_namespace_unless_the_binding_names_one(
    client: KubeClient,
) -> None:
    await install(client, guard(), binding("guard", "guard", paramRef=LIMITS))
    assert (await client.post(OTHER_CONFIGMAPS, limit("limit", "mallory"))).status == 201
    assert (await client.post(WIDGETS, widget("w1", note="mallory"))).status == 201
    assert (await client.post(OTHER_WIDGETS, widget("w1", note="mallory"))).status == 403

    elsewhere = {**LIMITS, "namespace": "other"}
    assert (await client.delete(f"{BINDINGS}/guard")).status == 200
    await install(client, binding("guard", "guard", paramRef=elsewhere))
    assert (await client.post(WIDGETS, widget("w2", note="mallory"))).status == 403


async def test_a_parameter_named_by_the_binding_is_the_only_one(client: KubeClient) -> None:
    named = {"name": "b-limit", "parameterNotFoundAction": "Deny"}
    await install(client, guard(), binding("guard", "guard", paramRef=named))
    await client.post(CONFIGMAPS, limit("a-limit", "eve"))
    await client.post(CONFIGMAPS, limit("b-limit", "mallory"))
    assert (await client.post(WIDGETS, widget("w1", note="eve"))).status == 201
    assert (
        denial(await client.post(WIDGETS, widget("w2", note="mallory")))
        == "configmap b-limit forbids mallory"
    )


@pytest.mark.parametrize(
    ("action", "failure_policy", "status"),
    [("Allow", "Fail", 201), ("Deny", "Fail", 422), ("Deny", "Ignore", 201)],
)
async def test_no_parameter_found_admits_under_allow_and_is_a_configuration_error_under_deny(
    client: KubeClient, action: str, failure_policy: str, status: int
) -> None:
    ref = {**LIMITS, "parameterNotFoundAction": action}
    await install(client, guard(failurePolicy=failure_policy), binding("guard", "guard", paramRef=ref))
    answer = await client.post(WIDGETS, widget("w1", note="mallory"))
    assert answer.status == status, answer.body
    if status == 422:
        assert denial(answer) == (
            "failed to configure binding: no params found for policy binding with `Deny` "
            "parameterNotFoundAction"
        )
        assert "with binding 'guard'" in answer.body["message"]


async def test_a_binding_without_param_ref_runs_the_policy_once_with_null_params(client: KubeClient) -> None:
    await install(client, guard(), binding("guard", "guard"))
    await client.post(CONFIGMAPS, limit("a-limit", "mallory"))
    answer = await client.post(WIDGETS, widget("w1", note="mallory"))
    assert answer.status == 422
    assert denial(answer) == (
        f"expression '{NOTE_NOT_FORBIDDEN['expression']}' resulted in error: no such key: data"
    )


async def test_a_param_kind_the_server_does_not_serve_is_a_configuration_error_of_the_policy(
    client: KubeClient,
) -> None:
    unknown = policy("guard", NOTE_NOT_FORBIDDEN, paramKind={"apiVersion": "v1", "kind": "NoSuchKind"})
    await install(client, unknown)
    # Without a binding the policy is never run.
    assert (await client.post(WIDGETS, widget("w1", note="mallory"))).status == 201
    await install(client, binding("guard", "guard", paramRef=LIMITS))
    answer = await client.post(WIDGETS, widget("w2", note="alice"))
    assert answer.status == 422
    assert answer.body["message"].endswith(
        "ValidatingAdmissionPolicy 'guard' denied request: failed to configure policy: failed to find "
        "resource referenced by paramKind: '/v1, Kind=NoSuchKind'"
    )


@pytest.mark.parametrize(
    ("param_ref", "causes"),
    [
        (
            {"name": "x", "selector": {}, "parameterNotFoundAction": "Allow"},
            [
                "spec.paramRef.name: Forbidden: name and selector are mutually exclusive",
                "spec.paramRef.selector: Forbidden: name and selector are mutually exclusive",
            ],
        ),
        (
            {"parameterNotFoundAction": "Allow"},
            ["spec.paramRef: Required value: one of name or selector must be specified"],
        ),
        ({"selector": {}}, ["spec.paramRef.parameterNotFoundAction: Required value"]),
        (
            {"selector": {}, "parameterNotFoundAction": "Maybe"},
            [
                'spec.paramRef.parameterNotFoundAction: Unsupported value: "Maybe": supported values: '
                '"Deny", "Allow"'
            ],
        ),
    ],
)
async def test_a_param_ref_is_validated_with_the_servers_messages(
    client: KubeClient, param_ref: dict[str, Any], causes: list[str]
) -> None:
    answer = await client.post(BINDINGS, binding("guard", "guard", paramRef=param_ref))
    assert answer.status == 422
    found = [f"{c['field']}: {c['message']}" for c in answer.body["details"]["causes"]]
    assert found == causes


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2.0, "2"),
        (7.25, "7.25"),
        (0.1 + 0.2, "0.30000000000000004"),
        (123456.0, "123456"),
        (123456789.0, "1.23456789e+08"),
        (1e21, "1e+21"),
        (1e-7, "1e-07"),
        (0.0001, "0.0001"),
        (-2.5, "-2.5"),
    ],
)
def test_string_of_a_double_is_written_as_cel_go_writes_it(value: float, text: str) -> None:
    # Measured on kube-apiserver v1.36: string(2.0) is "2", string(123456789.0) "1.23456789e+08".
    assert (
        compile_expression("string(params.x)", frozenset({"params"})).evaluate({"params": {"x": value}})
        == text
    )


async def test_namespaced_parameters_of_a_cluster_scoped_request_are_a_configuration_error(
    client: KubeClient,
) -> None:
    probe = {"matchLabels": {"probe": "yes"}}
    rules = [
        {"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["namespaces"]},
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["clusterroles"],
        },
    ]
    refuse = {"expression": "false", "messageExpression": "'param ' + params.metadata.name"}
    watched = policy("watched", refuse, paramKind=CONFIGMAP_PARAMS)
    watched["spec"]["matchConstraints"] = {"resourceRules": rules, "objectSelector": probe}
    ref = {"selector": {}, "parameterNotFoundAction": "Deny"}
    await install(client, watched, binding("watched", "watched", paramRef=ref))
    labels = {"probe": "yes"}
    role = {"metadata": {"name": "probe", "labels": labels}, "rules": []}
    answer = await client.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    assert answer.status == 422
    assert denial(answer) == (
        "failed to configure binding: cannot use namespaced paramRef in policy binding that matches "
        "cluster-scoped resources"
    )
    # A Namespace is looked up in itself (its admission attributes carry its own name as namespace).
    answer = await client.post("/api/v1/namespaces", {"metadata": {"name": "probe", "labels": labels}})
    assert answer.status == 422
    assert denial(answer).startswith("failed to configure binding: no params found")
