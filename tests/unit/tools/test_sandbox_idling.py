"""spec.sandbox.idleTimeoutSeconds against the emulator, the test moving the idle timer's clock by hand
and playing the kubelet (test_sandbox_pods.Kubelet): the pod goes after the timeout and only then, the
run is marked so a restarted operator does not take the missing pod for a lost one, and the next call
starts a new pod and tells the model its workspace is fresh.

The emulator runs no container, so each call's exec is refused (the pod is on no node): a call that
ends with an error is a call all the same, and what the idle timer counts is calls.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.controller.agents.pools import WarmPools
from agentrun.loop.errors import ToolError
from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.idling import IDLED_ANNOTATION
from agentrun.tools.sandbox.pod_exec import ExecResult
from agentrun.tools.sandbox.pods import RunIdentity, SandboxPod
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.clocks import ManualTime
from tests.support.waiting import until
from tests.unit.tools import test_sandbox_pods as pods_tests
from tests.unit.tools.test_sandbox_pods import (
    NS,
    POOLED,
    SPEC,
    USER,
    Kubelet,
    pod_of,
    run_of,
    running,
    unclaimed,
)

# The emulated cluster, the operator's connection and the run, as the pod tests have them.
cluster = pods_tests.cluster
connection = pods_tests.connection
run = pods_tests.run

IDLE = SPEC.model_copy(update={"idle_timeout_seconds": 600})


async def call(sandbox: SandboxPod) -> ExecResult | ToolError:
    """One sandbox call as the tools make it."""
    try:
        return await sandbox.exec(["true"], timeout=5)
    except ToolError as exc:
        return exc


def marks(cluster: KubeEmulator, run: str = "fix-build") -> dict[str, Any]:
    annotations = cluster.emulator.get_object("agentruns", NS, run)["metadata"].get("annotations")
    return {k: v for k, v in (annotations or {}).items() if k == IDLED_ANNOTATION}


def policies(cluster: KubeEmulator) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.emulator.list_objects("networkpolicies", NS)]


async def armed(time: ManualTime, seconds: float) -> None:
    """The idle timer sleeps, with this long left: the readiness signal before the clock moves."""
    await until(lambda: time.sleeping, f"the idle timer ({seconds:g} s left)", done=lambda s: s == [seconds])


def sandbox_of(
    spec: SandboxSpec, run: RunIdentity, connection: KubeConnection, time: ManualTime, **kw: Any
) -> SandboxPod:
    return SandboxPod(spec, run, connection, user=USER, idle_sleep=time.sleep, **kw)


async def test_an_idle_pod_goes_with_its_policy_the_run_is_marked_and_the_next_call_told_the_workspace_is_new(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    time = ManualTime()
    started: list[str] = []
    deleted: list[str] = []
    sandbox = sandbox_of(
        IDLE,
        run,
        connection,
        time,
        started=lambda seconds, reason: started.append(reason),
        idle_deleted=lambda: deleted.append("idle"),
    )
    with Kubelet(cluster):
        await call(sandbox)
        first = pod_of(cluster)
        assert first is not None and policies(cluster) == [first["metadata"]["name"]]
        await armed(time, 600)
        time.advance(599)
        await armed(time, 1)
        assert pod_of(cluster) == first and marks(cluster) == {} and deleted == []
        time.advance(1)
        await until(lambda: pod_of(cluster), "the idle pod deleted", done=lambda pod: pod is None)
        assert policies(cluster) == [] and deleted == ["idle"]
        assert marks(cluster) == {IDLED_ANNOTATION: first["metadata"]["name"]}

        told = await call(sandbox)
        assert isinstance(told, ToolError) and told.code == "sandbox_idled" and told.recoverable
        assert "deleted after 600 s without a sandbox call" in told.message
        assert "this is a fresh workspace" in told.message and "This command was not run." in told.message
        second = pod_of(cluster)
        assert second is not None and second["metadata"]["uid"] != first["metadata"]["uid"]
        assert marks(cluster) == {} and policies(cluster) == [second["metadata"]["name"]]
        assert started == ["first", "idle"]
        # The call that started the new pod counts too: the new pod has its own full timeout.
        await armed(time, 600)
    await sandbox.close()
    assert time.sleeping == []  # the run ended (or went elsewhere): no timer left to fire


async def test_a_call_in_flight_holds_the_timer_and_each_call_starts_the_count_again(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    time = ManualTime()
    sandbox = sandbox_of(IDLE, run, connection, time)
    with Kubelet(cluster):
        await call(sandbox)
        first = pod_of(cluster)
        await armed(time, 600)
        time.advance(400)
        # A slow call: while it runs no timer sleeps, so no time passing can delete its pod.
        cluster.emulator.faults.add(subresource="exec", delay=0.5, status=None, times=1)
        slow = asyncio.get_running_loop().create_task(call(sandbox))
        await until(lambda: time.sleeping, "the timer stopped by the call", done=lambda s: s == [])
        time.advance(10_000)
        await slow
        assert pod_of(cluster) == first
        await armed(time, 600)  # counted again from the end of the call, not from the first one
        time.advance(599)
        await armed(time, 1)
        assert pod_of(cluster) == first
        time.advance(1)
        await until(lambda: pod_of(cluster), "the idle pod deleted", done=lambda pod: pod is None)
    await sandbox.close()


async def test_a_pod_deleted_as_idle_before_a_restart_is_no_lost_pod_even_with_on_pod_lost_fail(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    spec = IDLE.model_copy(update={"on_pod_lost": "Fail"})
    time = ManualTime()
    before = sandbox_of(spec, run, connection, time)
    with Kubelet(cluster):
        await call(before)
        await armed(time, 600)
        time.advance(600)
        await until(lambda: pod_of(cluster), "the idle pod deleted", done=lambda pod: pod is None)
        await before.close()  # the operator stops (a crash leaves the same: nothing in memory)

        started: list[str] = []
        after = sandbox_of(
            spec, run, connection, time, resumed=True, started=lambda seconds, reason: started.append(reason)
        )
        await armed(time, 600)  # the resumed run's clock starts at the resume
        told = await call(after)
    assert isinstance(told, ToolError) and told.code == "sandbox_idled" and told.recoverable
    assert pod_of(cluster) is not None and marks(cluster) == {} and started == ["idle"]
    await after.close()


async def test_a_mark_left_by_a_crash_is_removed_when_the_pod_runs_and_hides_no_later_loss(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    spec = IDLE.model_copy(update={"on_pod_lost": "Fail"})
    time = ManualTime()
    with Kubelet(cluster):
        before = sandbox_of(spec, run, connection, time)
        await call(before)
        await before.close()
        # As if the operator died between marking the run and deleting the pod.
        pod = pod_of(cluster)
        assert pod is not None
        patch = {"metadata": {"annotations": {IDLED_ANNOTATION: pod["metadata"]["name"]}}}
        cluster.emulator.patch_object("agentruns", NS, "fix-build", patch)
        after = sandbox_of(spec, run, connection, time, resumed=True)
        await call(after)
        assert marks(cluster) == {} and pod_of(cluster) == pod
        cluster.emulator.delete_object("pods", NS, pod["metadata"]["name"])
        lost = await call(after)
    assert isinstance(lost, ToolError) and "onPodLost is Fail" in lost.message and not lost.recoverable
    await after.close()


async def test_without_an_idle_timeout_no_timer_runs_and_the_run_is_never_read(
    cluster: KubeEmulator, connection: KubeConnection, run: RunIdentity
) -> None:
    time = ManualTime()
    sandbox = sandbox_of(SPEC, run, connection, time, resumed=True)
    with Kubelet(cluster):
        await call(sandbox)
        await call(sandbox)
    assert time.sleeping == []
    assert not [r for r in cluster.emulator.request_log if r.resource == "agentruns"]
    await sandbox.close()


async def test_a_claimed_pool_pod_found_again_after_a_restart_is_deleted_as_idle_under_its_pool_name(
    cluster: KubeEmulator, connection: KubeConnection
) -> None:
    spec = POOLED.model_copy(update={"idle_timeout_seconds": 600})
    manifest = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "fixer", "namespace": NS},
        "spec": {
            "model": {"name": "claude-sonnet-4-6"},
            "serviceAccountName": "runner",
            "sandbox": spec.model_dump(mode="json", by_alias=True, exclude_defaults=True),
        },
    }
    agent = cluster.emulator.create_object("agents", manifest)
    pools = WarmPools(connection)
    pools.observe(None, agent)
    run = run_of(cluster, "fix-1")
    time = ManualTime()

    def named(name: str) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in cluster.emulator.list_objects("pods", NS)
            if p["metadata"]["name"] == name
        ]

    with Kubelet(cluster):
        await pools.fill(agent["metadata"]["uid"])
        [warm] = await until(lambda: unclaimed(cluster, agent), "the warm pod runs", done=running)
        before = sandbox_of(spec, run, connection, time)
        await call(before)
        assert before.name == warm["metadata"]["name"]
        await before.close()
        # A new operator knows the run only: it finds the claimed pod by its label, as idle as any.
        after = sandbox_of(spec, run, connection, time, resumed=True)
        await armed(time, 600)
        time.advance(600)
        await until(
            lambda: named(before.name), "the claimed pool pod deleted", done=lambda found: found == []
        )
        assert marks(cluster, "fix-1") == {IDLED_ANNOTATION: before.name}
        told = await call(after)
    assert isinstance(told, ToolError) and told.code == "sandbox_idled"
    assert marks(cluster, "fix-1") == {} and after.name != before.name
    await after.close()
    await pools.close()
