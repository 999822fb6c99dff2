"""The membership on its own thread: the operator's event loop being busy does not delay renewals.

The emulator serves from a thread of its own here, so that blocking the test's event loop (the stand-in
for an operator loop saturated by its runs) blocks neither the API server nor the membership.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from agentrun.controller.replicas.detached import DetachedMembership
from agentrun.controller.replicas.membership import GROUP_LABEL
from agentrun.kube import calling, kubeconfig_loading
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun.settings import Settings
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.kube_requests import until

#: Fencing after 4 − 1 − 1 = 2 s without a renewal; the loop is blocked longer than the whole Lease.
DURATION, RENEW, BLOCKED = 4, 1.0, 4.5
_groups = itertools.count()


@contextlib.contextmanager
def emulator_on_a_thread() -> Iterator[KubeEmulator]:
    started: concurrent.futures.Future[tuple[KubeEmulator, asyncio.AbstractEventLoop, asyncio.Event]] = (
        concurrent.futures.Future()
    )

    async def serve() -> None:
        stop = asyncio.Event()
        async with KubeEmulator.running() as cluster:
            started.set_result((cluster, asyncio.get_running_loop(), stop))
            await stop.wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    cluster, loop, stop = started.result(timeout=10)
    try:
        yield cluster
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def connecting(cluster: KubeEmulator) -> Callable[[], Awaitable[KubeClient]]:
    async def connect() -> KubeClient:
        return await calling.connect(await kubeconfig_loading.load(str(cluster.kubeconfig_path)))

    return connect


def block_the_loop(seconds: float) -> None:
    """What a saturated operator does to its event loop: nothing else runs on it meanwhile."""
    time.sleep(seconds)


def in_group(cluster: KubeEmulator, group: str) -> list[dict[str, object]]:
    leases = cluster.emulator.list_objects("leases", "default")
    return [lease for lease in leases if (lease["metadata"].get("labels") or {}).get(GROUP_LABEL) == group]


def detached(
    cluster: KubeEmulator,
    name: str,
    group: str = "detached",
    *,
    loop_stall_seconds: float = 30.0,
    metrics: Metrics | None = None,
) -> DetachedMembership:
    settings = Settings(
        lease_namespace="default",
        replica_name=name,
        replica_group=group,
        lease_duration_seconds=DURATION,
        lease_renew_seconds=RENEW,
        loop_stall_seconds=loop_stall_seconds,
    )
    metrics = metrics if metrics is not None else Metrics(CollectorRegistry())
    return DetachedMembership(settings, metrics, connect=connecting(cluster))


@contextlib.asynccontextmanager
async def serving(one: DetachedMembership) -> AsyncIterator[list[bool]]:
    """Runs ``one`` as the operator does: applies every view at once (no run to stop), leaves at the end;
    yields what each change the operator's loop heard said about fencing."""
    heard: list[bool] = []
    pending: set[asyncio.Task[None]] = set()

    def changed() -> None:
        assert threading.current_thread() is threading.main_thread()
        heard.append(one.fenced)
        task = asyncio.get_running_loop().create_task(one.applied(one.view))
        pending.add(task)
        task.add_done_callback(pending.discard)

    one.subscribe(changed)
    running = asyncio.create_task(one.run())
    try:
        await until(lambda: one.standing.barrier_passed, "the member joined and applied its view")
        yield heard
    finally:
        running.cancel()
        await asyncio.gather(running, *pending, return_exceptions=True)
        await one.leave()


async def test_a_detached_member_keeps_renewing_while_the_operators_event_loop_is_blocked() -> None:
    with emulator_on_a_thread() as cluster:
        one = detached(cluster, "op-a")
        async with serving(one) as heard:
            uid = "uid-1"
            assert one.owns(uid)
            block_the_loop(BLOCKED)  # longer than the Lease: only renewals sent meanwhile keep it alive
            assert not one.fenced and one.owns(uid)
            await asyncio.sleep(RENEW)
            # Not even briefly: a fence heard here would have stopped every run of the replica.
            assert True not in heard
            assert not one.fenced and one.members == ("op-a",)


async def test_a_detached_member_cut_off_fences_on_time_even_while_the_event_loop_is_blocked() -> None:
    with emulator_on_a_thread() as cluster:
        one = detached(cluster, "op-a")
        async with serving(one) as heard:
            cluster.emulator.faults.add(verb="update", resource="leases", status=503, times=None)
            block_the_loop(DURATION - RENEW - 1 + 1.5)
            # Decided on the membership's own thread: true before this loop ran anything again.
            assert one.fenced and not one.owns("uid-1")
            await until(lambda: True in heard, "the operator's loop hears of the fence")
            cluster.emulator.faults.clear()
            await until(lambda: not one.fenced, "renewed again, it rejoins")


async def test_leaving_deletes_the_lease_and_ends_the_membership_thread() -> None:
    with emulator_on_a_thread() as cluster:
        group = f"leaving-{next(_groups)}"
        one = detached(cluster, "op-a", group)
        async with serving(one):
            assert [t for t in threading.enumerate() if t.name == "agentrun membership op-a"]
            assert len(in_group(cluster, group)) == 1
        assert in_group(cluster, group) == []
        assert not [t for t in threading.enumerate() if t.name == "agentrun membership op-a"]


async def test_a_detached_member_whose_event_loop_is_stuck_lets_its_lease_lapse_and_rejoins_when_it_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stall = 1.5
    with emulator_on_a_thread() as cluster:
        metrics = Metrics(CollectorRegistry())
        one = detached(cluster, "op-a", f"stuck-{next(_groups)}", loop_stall_seconds=stall, metrics=metrics)
        async with serving(one) as heard:
            tenure = one.tenure
            assert tenure is not None and one.owns("uid-1")
            # Past the stall limit, then past the fence's deadline (2 s after the last renewal).
            block_the_loop(stall + DURATION - RENEW - 1 + 1.5)
            # Decided on the membership's own thread, before this loop ran anything again.
            assert one.fenced and one.tenure is None and not one.owns("uid-1")
            lag = metrics.registry.get_sample_value(
                "agentrun_replica_event_loop_lag_seconds", {"replica": "op-a"}
            )
            assert lag is not None and lag > stall, lag
            await until(lambda: True in heard, "the operator's loop hears of the fence")
            await until(lambda: not one.fenced, "its loop runs again: it renews and rejoins")
            assert one.tenure is not None and one.tenure != tenure
            await until(lambda: one.standing.barrier_passed, "a new member: it applies its view again")
    stalled = [r.getMessage() for r in caplog.records if "has not run for" in r.getMessage()]
    assert len(stalled) == 1, stalled
    assert re.fullmatch(
        r"replica op-a: the operator's event loop has not run for \d+\.\ds; not renewing its Lease so "
        r"other replicas take its runs",
        stalled[0],
    )
