"""The sandbox pod's life against the emulator, the test playing the kubelet with status patches:
started once and timed, found again after a restart, replaced (and said so) when lost, refused
clearly when its image cannot run, removed at the end; an Agent's warm pool filled, claimed by one
run of two racing for its pod, refilled, and gone with the Agent."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from agentrun.api.agent import WarmPoolStatus
from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.controller.agentruns.tool_environment import kube_connection
from agentrun.controller.agents.pools import WarmPools
from agentrun.loop.errors import ToolError
from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.manifests import LABEL_POOL, LABEL_POOL_AGENT, LABEL_RUN_UID, sandbox_pod_name
from agentrun.tools.sandbox.pods import RunIdentity, SandboxPod
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.waiting import until

NS = "default"
USER = f"system:serviceaccount:{NS}:runner"
CRDS = Path(__file__).resolve().parents[3] / "crds"
CRD = CRDS / "agentruns.agentrun.dev.yaml"
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
    async with KubeEmulator.running(crd_paths=[CRD, CRDS / "agents.agentrun.dev.yaml"]) as kube:
        rules = [
            # list and patch: an Agent's warm pool (filled and claimed as this ServiceAccount).
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete", "list", "patch"]},
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
    timings: list[tuple[float, str]] = []
    sandbox = SandboxPod(SPEC, run, connection, user=USER, started=lambda s, r: timings.append((s, r)))
    with Kubelet(cluster):
        await start(sandbox)
        await start(sandbox)
    pod = pod_of(cluster)
    assert pod is not None and pod["metadata"]["name"] == sandbox.name
    assert len(timings) == 1 and timings[0][1] == "first" and timings[0][0] >= 0
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
    timings: list[tuple[float, str]] = []
    sandbox = SandboxPod(SPEC, run, connection, user=USER, started=lambda s, r: timings.append((s, r)))
    with Kubelet(cluster):
        await start(sandbox)
        cluster.emulator.delete_object("pods", NS, sandbox.name)
        with pytest.raises(ToolError, match="a new, empty one was started") as lost:
            await start(sandbox)
        assert lost.value.code == "sandbox_replaced" and lost.value.recoverable
        await start(sandbox)  # the next command runs in the new pod
    assert [reason for _, reason in timings] == ["first", "replaced"]
    await sandbox.close()


async def test_a_lost_pod_whose_workspace_is_a_claim_is_replaced_and_the_model_told_its_files_are_kept(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    claim = {"name": "repo", "mountPath": "/workspace", "persistentVolumeClaim": {"claimName": "repo"}}
    spec = SandboxSpec.model_validate({**SPEC.model_dump(by_alias=True), "volumes": [claim]})
    sandbox = SandboxPod(spec, run, connection, user=USER)
    with Kubelet(cluster):
        await start(sandbox)
        cluster.emulator.delete_object("pods", NS, sandbox.name)
        with pytest.raises(ToolError) as lost:
            await start(sandbox)
    assert lost.value.code == "sandbox_replaced" and lost.value.recoverable
    assert "the files in /workspace are kept" in str(lost.value)
    assert "everything in the workspace is gone" not in str(lost.value)
    pod = pod_of(cluster)  # the new pod mounts the same claim
    assert pod is not None and [v["name"] for v in pod["spec"]["volumes"]] == ["tmp", "agentrun", "repo"]
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


class FakeTime:
    """The pod's clock and sleep: a wait for the start timeout passes without waiting for it."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0.01)  # the emulator and the test's kubelet get their turn


async def kubelet_reports(cluster: KubeEmulator, status: dict[str, Any]) -> None:
    """Gives the first sandbox pod ``status`` (what the real node showed for it), once."""
    pod = await until(lambda: pod_of(cluster), "the sandbox pod", 10, every=0.01)
    cluster.emulator.patch_object(
        "pods", NS, pod["metadata"]["name"], {"status": status}, subresource="status"
    )


#: The scheduler's word for a pod whose claim does not exist (kube-scheduler v1.36, measured).
UNSCHEDULABLE = '0/1 nodes are available: persistentvolumeclaim "absent" not found. not found'


@pytest.mark.parametrize(
    ("volume", "status", "said"),
    [
        (
            {"name": "settings", "mountPath": "/etc/settings", "configMap": {"name": "absent"}},
            {
                "phase": "Pending",
                "containerStatuses": [
                    {"name": "sandbox", "state": {"waiting": {"reason": "ContainerCreating"}}}
                ],
            },
            "(phase Pending, ContainerCreating): a ConfigMap or Secret of spec.sandbox.volumes that is "
            "missing keeps a pod there (its Events say which: kubectl describe pod)",
        ),
        (
            {"name": "cache", "mountPath": "/cache", "persistentVolumeClaim": {"claimName": "absent"}},
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": UNSCHEDULABLE,
                    }
                ],
            },
            f"(phase Pending): not scheduled: {UNSCHEDULABLE}",
        ),
    ],
    ids=["config-map-missing", "claim-missing"],
)
async def test_a_pod_whose_volume_cannot_be_mounted_times_out_saying_why(
    cluster: KubeEmulator,
    connection: KubeConnection,
    run: RunIdentity,
    volume: dict[str, Any],
    status: dict[str, Any],
    said: str,
) -> None:
    spec = SandboxSpec.model_validate({**SPEC.model_dump(by_alias=True), "volumes": [volume]})
    time = FakeTime()
    sandbox = SandboxPod(spec, run, connection, user=USER, clock=time.clock, sleep=time.sleep)
    kubelet = asyncio.create_task(kubelet_reports(cluster, status))
    with pytest.raises(ToolError, match="did not start within 10 s") as failed:
        await start(sandbox)
    await kubelet
    assert said in str(failed.value) and not failed.value.recoverable
    await sandbox.close()


POOLED = SPEC.model_copy(update={"warm_pool": 1})


def agent_of(cluster: KubeEmulator, name: str, warm_pool: int) -> dict[str, Any]:
    """An Agent whose runs use POOLED's sandbox as the runner ServiceAccount."""
    sandbox = POOLED.model_copy(update={"warm_pool": warm_pool}).model_dump(
        mode="json", by_alias=True, exclude_defaults=True
    )
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"model": {"name": "claude-sonnet-4-6"}, "serviceAccountName": "runner", "sandbox": sandbox},
    }
    return cluster.emulator.create_object("agents", manifest)


def run_of(cluster: KubeEmulator, name: str) -> RunIdentity:
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"task": "fix the build", "agentRef": {"name": "fixer"}},
    }
    created = cluster.emulator.create_object("agentruns", manifest)
    return RunIdentity(NS, name, created["metadata"]["uid"], "runner")


def unclaimed(cluster: KubeEmulator, agent: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        pod
        for pod in cluster.emulator.list_objects("pods", NS)
        if pod["metadata"]["labels"].get(LABEL_POOL_AGENT) == agent["metadata"]["uid"]
        and LABEL_RUN_UID not in pod["metadata"]["labels"]
    ]


def running(pods: list[dict[str, Any]]) -> bool:
    return bool(pods) and all(pod.get("status", {}).get("phase") == "Running" for pod in pods)


async def test_of_two_runs_racing_for_one_warm_pod_one_claims_it_and_the_other_starts_its_own(
    cluster: KubeEmulator, connection: KubeConnection
) -> None:
    agent = agent_of(cluster, "fixer", warm_pool=1)
    pools = WarmPools(connection)
    pools.observe(None, agent)
    first, second = run_of(cluster, "fix-1"), run_of(cluster, "fix-2")
    timings: list[tuple[float, str]] = []
    sandboxes = [
        SandboxPod(POOLED, run, connection, user=USER, started=lambda s, r: timings.append((s, r)))
        for run in (first, second)
    ]
    with Kubelet(cluster):
        await pools.fill(agent["metadata"]["uid"])
        [warm] = await until(lambda: unclaimed(cluster, agent), "the warm pod runs", done=running)
        # Both claims are held back until both runs have listed the pool: both try the one pod.
        cluster.emulator.faults.add(method="PATCH", resource="pods", delay=0.3, status=None, times=2)
        await asyncio.gather(*(start(sandbox) for sandbox in sandboxes))
    claims = [r for r in cluster.emulator.request_log if r.method == "PATCH" and r.resource == "pods"]
    assert sorted(r.status for r in claims) == [200, 409]
    winner, loser = sandboxes if sandboxes[0].name == warm["metadata"]["name"] else sandboxes[::-1]
    assert winner.name == warm["metadata"]["name"] and loser.name == sandbox_name(loser)
    claimed = cluster.emulator.get_object("pods", NS, winner.name)
    assert claimed["metadata"]["labels"][LABEL_RUN_UID] == winner.run.uid
    assert LABEL_POOL_AGENT not in claimed["metadata"]["labels"]
    assert [(o["kind"], o["uid"]) for o in claimed["metadata"]["ownerReferences"]] == [
        ("AgentRun", winner.run.uid)
    ]
    # Only the loser waited for a pod start; a claimed pod is no start.
    assert [reason for _, reason in timings] == ["first"]
    assert winner.started_seconds is None and loser.started_seconds is not None
    for sandbox in sandboxes:
        await sandbox.close()
    await pools.close()


def sandbox_name(sandbox: SandboxPod) -> str:
    return sandbox_pod_name(sandbox.run.name, sandbox.run.uid)


async def test_the_pool_is_refilled_its_claimed_pod_found_again_and_its_pods_go_with_the_agent(
    cluster: KubeEmulator, connection: KubeConnection
) -> None:
    agent = agent_of(cluster, "fixer", warm_pool=2)
    uid = agent["metadata"]["uid"]
    pools = WarmPools(connection, poll_seconds=0.05)
    pools.observe(None, agent)
    run = run_of(cluster, "fix-1")
    sandbox = SandboxPod(POOLED, run, connection, user=USER)
    with Kubelet(cluster):
        filling = asyncio.get_running_loop().create_task(pools.keep_filling())
        try:
            pool = await until(lambda: unclaimed(cluster, agent), "two warm pods", done=lambda p: len(p) == 2)
            await until(lambda: running(unclaimed(cluster, agent)), "the warm pods run")
            await start(sandbox)
            assert sandbox.name in {pod["metadata"]["name"] for pod in pool}
            # The claimed pod left the pool, which the poll fills up again.
            refilled = await until(
                lambda: unclaimed(cluster, agent),
                "the pool refilled",
                done=lambda p: len(p) == 2 and sandbox.name not in {pod["metadata"]["name"] for pod in p},
            )
            assert all(
                re.fullmatch(r"fixer-sandbox-pool-[a-z0-9]{5}", pod["metadata"]["name"]) for pod in refilled
            )
            assert len({pod["metadata"]["labels"][LABEL_POOL] for pod in refilled}) == 1
            # A restarted operator finds the claimed pod by the run's label: no new pod, no loss told.
            again = SandboxPod(POOLED, run, connection, user=USER, resumed=True)
            await start(again)
            assert again.name == sandbox.name and len(cluster.emulator.list_objects("pods", NS)) == 3
            # The Agent deleted: its unclaimed pods go with it; the claimed one stays the run's.
            pools.observe("DELETED", agent)
            cluster.emulator.delete_object("agents", NS, "fixer")
            await until(
                lambda: [pod["metadata"]["name"] for pod in cluster.emulator.list_objects("pods", NS)],
                "only the claimed pod left",
                done=lambda names: names == [sandbox.name],
            )
            assert uid not in pools.agents
            # The run ends: its claimed pod is removed by the run, as its own would be.
            await again.remove()
            assert cluster.emulator.list_objects("pods", NS) == []
        finally:
            filling.cancel()
    await sandbox.close()
    await again.close()
    await pools.close()


async def test_a_smaller_pool_deletes_its_extra_pods_and_a_changed_sandbox_replaces_them(
    cluster: KubeEmulator, connection: KubeConnection
) -> None:
    agent = agent_of(cluster, "fixer", warm_pool=2)
    uid = agent["metadata"]["uid"]
    pools = WarmPools(connection)
    pools.observe(None, agent)
    await pools.fill(uid)
    old = {pod["metadata"]["name"] for pod in unclaimed(cluster, agent)}
    assert len(old) == 2
    changed = cluster.emulator.patch_object(
        "agents", NS, "fixer", {"spec": {"sandbox": {"warmPool": 1, "commandTimeoutSeconds": 30}}}
    )
    pools.observe("MODIFIED", changed)
    await pools.fill(uid)
    now = unclaimed(cluster, agent)
    assert len(now) == 1 and now[0]["metadata"]["name"] not in old
    zero = cluster.emulator.patch_object("agents", NS, "fixer", {"spec": {"sandbox": {"warmPool": 0}}})
    pools.observe("MODIFIED", zero)
    await pools.fill(uid)
    assert unclaimed(cluster, agent) == []
    await pools.close()


async def test_the_pool_state_counts_running_pods_and_is_told_only_when_it_changes(
    cluster: KubeEmulator, connection: KubeConnection
) -> None:
    agent = agent_of(cluster, "fixer", warm_pool=2)
    uid = agent["metadata"]["uid"]
    pools = WarmPools(connection)
    told: list[str] = []
    pools.changed = told.append
    pools.observe(None, agent)
    await pools.fill(uid)  # two pods created, none running yet
    assert pools.states[uid] == WarmPoolStatus(size=2, ready=0, message=None) and told == [uid]
    with Kubelet(cluster):
        await until(lambda: running(unclaimed(cluster, agent)), "the warm pods run")
    await pools.fill(uid)
    assert pools.states[uid] == WarmPoolStatus(size=2, ready=2, message=None) and told == [uid, uid]
    await pools.fill(uid)  # nothing changed: nobody told
    assert told == [uid, uid]
    # The sandbox removed from the Agent: the pool's state goes (status.warmPool cleared).
    plain = cluster.emulator.patch_object("agents", NS, "fixer", {"spec": {"sandbox": None}})
    pools.observe("MODIFIED", plain)
    assert uid not in pools.states and told == [uid, uid, uid]
    await pools.close()
