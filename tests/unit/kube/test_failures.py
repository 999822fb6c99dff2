"""Cluster failures read as one line: what failed, what the server said, what to do next."""

from __future__ import annotations

import json

import kopf
import pytest

from agentrun.kube.errors import APIError, APITransportError, refused
from agentrun.kube.failures import KubeFailure, explain, explained
from agentrun.kube.kubeconfig_loading import ClusterAccess

ACCESS = ClusterAccess(server="https://10.0.0.1:6443", source="kubeconfig /k (context prod)")


def _refusal(status: int, message: str) -> APIError:
    return refused(status, "Reason", json.dumps({"kind": "Status", "message": message, "code": status}), None)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            401,
            "cannot list agentruns: the API server at https://10.0.0.1:6443 did not accept the credentials "
            "of kubeconfig /k (context prod) (HTTP 401: Unauthorized); log in again or renew the token, "
            "then retry",
        ),
        (
            403,
            'cannot list agentruns: forbidden (HTTP 403: User "x" cannot list agentruns); grant this '
            "identity the RBAC permission the message names, or use another context",
        ),
        (404, "agentruns not found"),
        (409, "cannot list agentruns: conflict (HTTP 409: modified); retry"),
        (
            422,
            "cannot list agentruns: the API server refused it (HTTP 422: spec.x: Invalid value); fix what "
            "the message names",
        ),
        (
            503,
            "cannot list agentruns: the API server is unavailable (HTTP 503: overloaded); retry in a moment",
        ),
    ],
)
def test_each_refusal_names_the_action_the_servers_message_and_the_next_step(
    status: int, expected: str
) -> None:
    said = {
        401: "Unauthorized",
        403: 'User "x" cannot list agentruns',
        404: "not found",
        409: "modified",
        422: "spec.x: Invalid value",
        503: "overloaded",
    }[status]
    assert explain(_refusal(status, said), "list", "agentruns", access=ACCESS) == expected


def test_a_missing_collection_can_say_what_is_missing_and_a_long_message_stays_one_bounded_line() -> None:
    missing = explain(_refusal(404, "x"), "list", "agentruns", missing="the CRD is not installed")
    assert missing == "cannot list agentruns: the CRD is not installed"
    long = explain(_refusal(422, "line one\nline two " + "x" * 2000), "create", "the CRD", invalid="upgrade")
    assert long is not None and "\n" not in long and len(long) < 700 and long.endswith("…); upgrade")


def test_kopfs_login_error_is_explained_by_the_401_behind_it() -> None:
    try:
        try:
            raise _refusal(401, "Unauthorized")
        except APIError as exc:
            raise kopf.LoginError("Ran out of valid credentials.") from exc
    except kopf.LoginError as exc:
        message = explain(exc, "watch", "agentruns")
    assert message is not None and "(HTTP 401: Unauthorized); log in again" in message


def test_a_bug_is_not_dressed_up_as_a_cluster_failure() -> None:
    assert explain(KeyError("status"), "list", "agentruns") is None
    with pytest.raises(KeyError), explained("list", "agentruns"):
        raise KeyError("status")
    with pytest.raises(KubeFailure, match=r"^agentruns not found$"), explained("list", "agentruns"):
        raise _refusal(404, "gone")


def test_a_transport_failure_is_worded_by_what_lies_behind_it() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('10.0.0.1', 6443)")
        except OSError as exc:
            raise APITransportError("Connect call failed") from exc
    except APITransportError as exc:
        message = explain(exc, "list", "agentruns", access=ACCESS)
    assert message == (
        "cannot list agentruns: cannot reach the Kubernetes API at https://10.0.0.1:6443 "
        "(Connection refused); check that the cluster is running and that kubeconfig /k (context prod) "
        "points at it"
    )
    bare = explain(APITransportError("Server disconnected"), "list", "agentruns", access=ACCESS)
    assert bare is not None and bare.startswith(
        "cannot list agentruns: cannot reach the Kubernetes API at https://10.0.0.1:6443 "
        "(Server disconnected); "
    )
