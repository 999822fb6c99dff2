"""The sandbox pod's life against the emulator, the test playing the kubelet with status patches:
started once and timed, found again after a restart, replaced (and said so) when lost, refused
clearly when its image cannot run, removed at the end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.controller.agentruns.tool_environment import kube_connection
from agentrun.loop.errors import ToolError
from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.pods import RunIdentity, SandboxPod
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator

NS = "default"
USER = f"system:serviceaccount:{NS}:runner"
CRD = Path(__file__).resolve().parents[3] / "crds" / "agentruns.agentrun.dev.yaml"
SPEC = SandboxSpec.model_validate(
    {
        "image": "localhost/agentrun-sandbox:dev",
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "128Mi"},
        },
        "startTimeoutSeconds": 10,
    }
)


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator.running(crd_paths=[CRD]) as kube:
        rules = [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
            {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
        ]
        kube.emulator.create_object("serviceaccounts", {"metadata": {"name": "runner", "namespace": NS}})
        kube.emulator.create_object(
            "roles", {"metadata": {"name": "runner", "namespace": NS}, "rules": rules}
        )
        binding = {
            "metadata": {"name": "runner", "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "runner"},
            "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": NS}],
        }
        kube.emulator.create_object("rolebindings", binding)
        yield kube


@pytest.fixture
def run(cluster: KubeEmulator) -> RunIdentity:
    """The run the pod belongs to: without it the garbage collector takes the pod at once."""
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "fix-build", "namespace": NS},
        "spec": {"task": "fix the build"},
    }
    created = cluster.emulator.create_object("agentruns", manifest)
    return RunIdentity(NS, "fix-build", created["metadata"]["uid"], "runner")


@pytest.fixture
async def connection(cluster: KubeEmulator) -> AsyncIterator[KubeConnection]:
    configuration = client.Configuration()
    await config.load_kube_config(
        config_file=str(cluster.kubeconfig_path), client_configuration=configuration
    )
    return kube_connection(configuration)


class Kubelet:
    """Plays the kubelet for the sandbox pod: once the pod exists, its container runs (or waits)."""

    def __init__(self, cluster: KubeEmulator, state: dict[str, Any] | None = None) -> None:
        self.cluster = cluster
        self.state = state or {"running": {"startedAt": "2026-11-28T00:00:00Z"}}
        self.phase = "Running" if "running" in self.state else "Pending"
        self.task: asyncio.Task[None] | None = None

    async def _serve(self) -> None:
        while True:
            for pod in self.cluster.emulator.list_objects("pods", NS):
                if not pod.get("status", {}).get("containerStatuses"):
                    status = {
                        "phase": self.phase,
                        "containerStatuses": [{"name": "sandbox", "state": self.state}],
                    }
                    self.cluster.emulator.patch_object(
                        "pods", NS, pod["metadata"]["name"], {"status": status}, subresource="status"
                    )
            await asyncio.sleep(0.05)

    def __enter__(self) -> Kubelet:
        self.task = asyncio.get_running_loop().create_task(self._serve())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()


def pod_of(cluster: KubeEmulator) -> dict[str, Any] | None:
    pods = cluster.emulator.list_objects("pods", NS)
    return pods[0] if pods else None


async def start(pod: SandboxPod) -> None:
    """What the first command does before its exec: make sure the pod runs."""
    await pod.ensure_running()


async def test_the_pod_is_started_once_timed_and_found_again_by_a_restarted_operator(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    timings: list[tuple[float, bool]] = []
    sandbox = SandboxPod(SPEC, run, connection, user=USER, started=lambda s, r: timings.append((s, r)))
    with Kubelet(cluster):
        await start(sandbox)
        await start(sandbox)
    pod = pod_of(cluster)
    assert pod is not None and pod["metadata"]["name"] == sandbox.name
    assert len(timings) == 1 and timings[0][1] is False and timings[0][0] >= 0
    # A new operator process (resumed run) finds the same pod and starts none.
    again = SandboxPod(
        SPEC, run, connection, user=USER, resumed=True, started=lambda s, r: timings.append((s, r))
    )
    await start(again)
    assert len(timings) == 1 and pod_of(cluster)["metadata"]["uid"] == pod["metadata"]["uid"]
    await sandbox.close()
    await again.close()


async def test_a_lost_pod_is_replaced_and_the_command_not_run_is_said_to_the_model(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    timings: list[tuple[float, bool]] = []
    sandbox = SandboxPod(SPEC, run, connection, user=USER, started=lambda s, r: timings.append((s, r)))
    with Kubelet(cluster):
        await start(sandbox)
        cluster.emulator.delete_object("pods", NS, sandbox.name)
        with pytest.raises(ToolError, match="a new, empty one was started") as lost:
            await start(sandbox)
        assert lost.value.code == "sandbox_replaced" and lost.value.recoverable
        await start(sandbox)  # the next command runs in the new pod
    assert [replaced for _, replaced in timings] == [False, True]
    await sandbox.close()


async def test_with_on_pod_lost_fail_a_lost_pod_ends_the_run(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    spec = SPEC.model_copy(update={"on_pod_lost": "Fail"})
    sandbox = SandboxPod(spec, run, connection, user=USER, resumed=True)
    with pytest.raises(ToolError, match="onPodLost is Fail") as lost:
        await start(sandbox)
    assert not lost.value.recoverable and pod_of(cluster) is None
    await sandbox.close()


async def test_an_image_that_cannot_run_fails_at_once_naming_why(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    sandbox = SandboxPod(SPEC, run, connection, user=USER)
    waiting = {
        "waiting": {"reason": "ErrImageNeverPull", "message": "image not present with pull policy Never"}
    }
    with (
        Kubelet(cluster, waiting),
        pytest.raises(ToolError, match="cannot start: ErrImageNeverPull") as failed,
    ):
        await start(sandbox)
    assert not failed.value.recoverable
    await sandbox.remove()
    assert pod_of(cluster) is None
    await sandbox.close()
