"""exec_in_pod against a real API server and a real kubelet: a command in a restricted pod, RBAC, gone pods.

What the emulator cannot show: the kubelet's channel stream (output, the exit code's Status, the close),
the container runtime's refusal of a missing binary, the v1.36 rule that an exec by websocket needs
both ``get`` and ``create`` on ``pods/exec``, and a pod deleted under the caller. No chart and no
operator: the test calls the transport itself, so it runs alone in seconds.
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.pod_exec import ExecError, ExecResult, exec_in_pod
from tests.support.clusters import TestCluster
from tests.support.node import IMAGE
from tests.support.waiting import until

CONTAINER = "work"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def connection(cluster: TestCluster) -> KubeConnection:
    """The admin's transport, as the operator's is: server, TLS (client certificate) and token."""
    context = cluster.credentials.ssl_context
    header = cluster.credentials.headers.get("Authorization")

    async def authorization() -> str | None:
        return header

    return KubeConnection(
        cluster.url, context if isinstance(context, ssl.SSLContext) else None, authorization
    )


def restricted_pod(name: str, **spec: Any) -> dict[str, Any]:
    """A pod the restricted Pod Security Standard admits, as a sandbox pod is: non-root, no privileges."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "infinity"],
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "32Mi"},
                        "limits": {"cpu": "500m", "memory": "128Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            **spec,
        },
    }


async def running_pod(cluster: TestCluster, name: str) -> None:
    await cluster.request("POST", cluster.path("pods"), json=restricted_pod(name))

    async def status() -> dict[str, Any]:
        pod = await cluster.request("GET", cluster.path("pods", name))
        found: dict[str, Any] = pod.get("status") or {}
        return found

    def ready(status: dict[str, Any]) -> bool:
        statuses = status.get("containerStatuses") or []
        return status.get("phase") == "Running" and bool(statuses) and all(s.get("ready") for s in statuses)

    await until(status, f"pod {name} running", timeout=120, done=ready)


async def run(
    cluster: TestCluster, pod: str, argv: list[str], *, user: str | None = None, **options: Any
) -> ExecResult:
    return await exec_in_pod(
        connection(cluster),
        user=user,
        namespace=cluster.namespace,
        pod=pod,
        container=CONTAINER,
        argv=argv,
        timeout=options.pop("timeout", 60),
        **options,
    )


async def exec_error(cluster: TestCluster, pod: str, argv: list[str], **options: Any) -> ExecError:
    with pytest.raises(ExecError) as caught:
        await run(cluster, pod, argv, **options)
    return caught.value


async def test_a_command_in_a_restricted_pod_gives_its_streams_and_exit_code(cluster: TestCluster) -> None:
    await running_pod(cluster, "sandbox")

    result = await run(cluster, "sandbox", ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n", b"err\n", 3)

    who = await run(cluster, "sandbox", ["id", "-u"])
    assert (who.stdout, who.exit_code) == (b"65532\n", 0)

    killed = await run(cluster, "sandbox", ["sh", "-c", "kill -9 $$"])
    assert killed.exit_code == 137

    flood = await run(cluster, "sandbox", ["head", "-c", "3000000", "/dev/zero"], output_limit=1_048_576)
    assert (len(flood.stdout), flood.stdout_dropped, flood.exit_code) == (1_048_576, 3_000_000 - 1_048_576, 0)

    missing = await exec_error(cluster, "sandbox", ["no-such-binary"])
    assert missing.kind == "exec_failed"
    assert "executable file not found" in missing.message

    slow = await exec_error(cluster, "sandbox", ["sleep", "30"], timeout=2)
    assert slow.kind == "timeout"


async def _grant(cluster: TestCluster, name: str, verbs: list[str]) -> str:
    """A ServiceAccount bound to a Role with ``verbs`` on ``pods/exec``; its user name."""
    await cluster.request("POST", cluster.path("serviceaccounts"), json={"metadata": {"name": name}})
    if verbs:
        role = {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": verbs}],
        }
        binding = {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}],
        }
        await cluster.request("POST", cluster.path("roles", api=RBAC), json=role)
        await cluster.request("POST", cluster.path("rolebindings", api=RBAC), json=binding)
    return f"system:serviceaccount:{cluster.namespace}:{name}"


async def test_an_impersonated_service_account_needs_get_and_create_on_pods_exec(
    cluster: TestCluster,
) -> None:
    await running_pod(cluster, "sandbox")
    nothing = await _grant(cluster, "nothing", [])
    create_only = await _grant(cluster, "create-only", ["create"])
    get_only = await _grant(cluster, "get-only", ["get"])
    both = await _grant(cluster, "both", ["get", "create"])

    async def outcome(user: str) -> str:
        try:
            result = await run(cluster, "sandbox", ["id", "-u"], user=user)
        except ExecError as exc:
            return exc.kind
        return f"exit {result.exit_code}: {result.stdout.decode().strip()}"

    # RBAC caches may take a moment to see new bindings: wait for the one that must work.
    async def as_both() -> bool:
        return await outcome(both) == "exit 0: 65532"

    await until(as_both, "get and create on pods/exec to allow exec")
    refused = {user: await outcome(user) for user in (nothing, create_only, get_only)}
    assert refused == {nothing: "forbidden", create_only: "forbidden", get_only: "forbidden"}
    error = await exec_error(cluster, "sandbox", ["true"], user=get_only)
    assert "exec needs get and create on pods/exec" in error.message


async def test_a_pod_not_on_a_node_is_not_running_and_a_deleted_pod_is_gone(cluster: TestCluster) -> None:
    unschedulable = restricted_pod("nowhere", nodeSelector={"agentrun.dev/no-such-node": "true"})
    await cluster.request("POST", cluster.path("pods"), json=unschedulable)
    pending = await exec_error(cluster, "nowhere", ["true"])
    assert (pending.kind, "pod nowhere does not have a host assigned" in pending.message) == (
        "not_running",
        True,
    )

    await running_pod(cluster, "sandbox")
    assert (await run(cluster, "sandbox", ["true"])).exit_code == 0
    await cluster.request("DELETE", cluster.path("pods", "sandbox"), json={"gracePeriodSeconds": 0})

    async def gone() -> bool:
        status, _ = await cluster.status_of("GET", cluster.path("pods", "sandbox"))
        return status == 404

    await until(gone, "the deleted pod to be gone", timeout=60)
    after = await exec_error(cluster, "sandbox", ["true"])
    assert after.kind == "gone"
    assert 'pods "sandbox" not found' in after.message
