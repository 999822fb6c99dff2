"""Membership through Leases on the emulated API server, each replica with its own fake monotonic clock.

Time only moves when a test moves it; a "tick" is what the run loop does every renew interval: renew,
then list the group's Leases.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import socket
from collections.abc import Callable

import pytest
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from agentrun.controller.replicas.membership import (
    APPLIED_VIEW,
    EXPIRY_SLACK_SECONDS,
    GROUP_LABEL,
    OBSERVE_SECONDS,
    Membership,
)
from agentrun.controller.replicas.ownership import Ownership, Standalone
from agentrun.controller.replicas.ring import owner
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun.settings import Settings
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from tests.support.kube_requests import until

DURATION, RENEW = 15, 5.0
UIDS = [f"uid-{i}" for i in range(60)]
_groups = itertools.count()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def member(kube: KubeClient, name: str, clock: Clock, group: str = "g") -> Membership:
    settings = Settings(
        lease_namespace="default",
        replica_name=name,
        replica_group=group,
        lease_duration_seconds=DURATION,
        lease_renew_seconds=RENEW,
    )
    return Membership(kube, settings, Metrics(CollectorRegistry()), clock=clock)


async def tick(*members: Membership) -> None:
    for one in members:
        await one.renew()
    for one in members:
        await one.observe()


async def settle(*members: Membership) -> None:
    """Every member applies its view (as the wiring does once its lost runs stopped), then looks again."""
    for one in members:
        await one.applied(one.view)
    for one in members:
        await one.observe()


async def alone(kube: KubeClient, name: str, clock: Clock) -> Membership:
    """A member that joined an empty group and owns every run."""
    one = member(kube, name, clock)
    await tick(one)
    await settle(one)
    assert one.barrier_passed and all(one.owns(uid) for uid in UIDS)
    return one


async def settled_pair(kube: KubeClient) -> tuple[Membership, Membership, Clock, Clock]:
    """Two members, each on its own clock, that agree on their view and passed its barrier."""
    clock_a, clock_b = Clock(), Clock()
    a, b = member(kube, "op-a", clock_a), member(kube, "op-b", clock_b)
    await tick(a, b)
    await tick(a, b)
    await settle(a, b)
    assert a.barrier_passed and b.barrier_passed and a.members == b.members == ("op-a", "op-b")
    return a, b, clock_a, clock_b


def dead_kube() -> KubeClient:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return KubeClient(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")))


async def test_two_and_then_three_members_agree_on_the_view_and_split_the_runs(kube: KubeClient) -> None:
    clock = Clock()
    a, b = member(kube, "op-a", clock), member(kube, "op-b", clock)
    await tick(a, b)
    await tick(a, b)
    assert a.members == b.members == ("op-a", "op-b") and a.view == b.view
    c = member(kube, "op-c", clock)
    await tick(a, b, c)
    await settle(a, b, c)
    assert a.members == b.members == c.members == ("op-a", "op-b", "op-c")
    assert a.metrics.registry.get_sample_value("agentrun_replica_members", {"replica": "op-a"}) == 3
    assert a.metrics.registry.get_sample_value("agentrun_replica_fenced", {"replica": "op-a"}) == 0
    assert len({a.view, b.view, c.view}) == 1
    for uid in UIDS:
        assert [one.owns(uid) for one in (a, b, c)].count(True) == 1
        assert a.owner(uid) == b.owner(uid) == c.owner(uid)


async def test_a_member_that_stops_renewing_is_dropped_after_the_duration_as_seen_by_the_others(
    kube: KubeClient,
) -> None:
    clock_a, clock_b = Clock(), Clock()
    a, b = member(kube, "op-a", clock_a), member(kube, "op-b", clock_b)
    await tick(a, b)
    await tick(a, b)
    # b stops renewing; a keeps going and watches b's Lease stay unchanged.
    for _ in range(3):
        clock_a.now += RENEW
        await tick(a)
    assert clock_a.now - 1000.0 == DURATION and a.members == ("op-a", "op-b")
    clock_a.now += 0.5
    await tick(a)
    assert a.members == ("op-a",)


@pytest.mark.parametrize("renewed_after", [0.1, 2.3, 4.9])
async def test_a_dead_member_is_dropped_within_a_second_of_its_lease_expiring_not_a_renew_interval(
    kube: KubeClient, renewed_after: float
) -> None:
    """The survivor's own rounds, in fake time: the wait between them is what `run` sleeps."""
    a, b, clock_a, clock_b = await settled_pair(kube)
    # b renews once more, somewhere in a's renew interval, and dies.
    clock_b.now = clock_a.now + renewed_after
    last_renewal = clock_b.now
    while clock_a.now + a.pause() < last_renewal:
        clock_a.now += a.pause()
        await a.step()
    await b.renew()
    while "op-b" in a.members:
        pause = a.pause()
        assert 0 < pause <= OBSERVE_SECONDS
        clock_a.now += pause
        await a.step()
        assert not a.fenced
    # Seen at most one listing after it was sent; gone right after the duration from then.
    assert (
        last_renewal + DURATION
        < clock_a.now
        <= last_renewal + OBSERVE_SECONDS + DURATION + EXPIRY_SLACK_SECONDS
    )


async def test_a_new_member_passes_no_barrier_before_it_has_listed_the_group_after_joining(
    kube: KubeClient,
) -> None:
    """Its first view is itself alone; were that view's barrier to pass, it would own every run."""
    clock = Clock()
    a = await alone(kube, "op-a", clock)
    b = member(kube, "op-b", clock)
    await b.renew()  # joined: the wiring hears of its view (op-b alone) and applies it at once
    await b.applied(b.view)
    assert b.members == ("op-b",) and not b.barrier_passed
    assert not any(b.owns(uid) for uid in UIDS)
    await b.observe()
    assert b.members == ("op-a", "op-b") and not b.barrier_passed
    await tick(a, b)
    await settle(a, b)
    assert a.barrier_passed and b.barrier_passed
    assert all([a.owns(uid), b.owns(uid)].count(True) == 1 for uid in UIDS)


async def test_a_member_back_from_a_fence_passes_no_barrier_before_it_lists_the_group_again(
    kube: KubeClient,
) -> None:
    a, b, clock_a, clock_b = await settled_pair(kube)
    clock_b.now += DURATION  # b's renewals stop; it fences itself, and a new replica joins meanwhile
    b.check_fence()
    assert b.fenced
    c = member(kube, "op-c", clock_a)
    await tick(a, c)
    await b.renew()  # back: what b last listed has no op-c
    await b.applied(b.view)
    assert not b.barrier_passed and not any(b.owns(uid) for uid in UIDS)
    await b.observe()
    assert "op-c" in b.members


async def test_the_barrier_holds_a_newly_owned_run_until_every_live_member_applied_the_view(
    kube: KubeClient,
) -> None:
    clock = Clock()
    a = await alone(kube, "op-a", clock)
    b = member(kube, "op-b", clock)
    await tick(b, a)
    two = ("op-a", "op-b")
    moving = [uid for uid in UIDS if owner(uid, two) == "op-b"]
    staying = [uid for uid in UIDS if owner(uid, two) == "op-a"]
    assert moving and staying and a.view == b.view
    # a stops serving the runs that move at once, and keeps those that stay without waiting.
    assert not any(a.owns(uid) for uid in moving) and all(a.owns(uid) for uid in staying)
    # b has applied the view, a has not yet stopped its lost runs: b must not start them.
    await b.applied(b.view)
    await b.observe()
    assert not any(b.owns(uid) for uid in moving)
    await a.applied(a.view)
    lease = await kube.get_lease("default", a.lease_name)
    assert lease["metadata"]["annotations"][APPLIED_VIEW] == a.view
    await b.observe()
    assert b.barrier_passed and all(b.owns(uid) for uid in moving)
    assert not any(b.owns(uid) for uid in staying)


async def test_a_run_that_moved_away_and_back_waits_for_the_barrier_again(kube: KubeClient) -> None:
    clock = Clock()
    a, b = member(kube, "op-a", clock), member(kube, "op-b", clock)
    await tick(a)
    await settle(a)
    await tick(b, a)
    moving = [uid for uid in UIDS if owner(uid, ("op-a", "op-b")) == "op-b"]
    await a.applied(a.view)  # a stopped the runs that moved to b
    await b.leave()
    await tick(a)
    assert a.members == ("op-a",)
    # Back to a alone, but a applied a view where b owned them: b may have run them, so a waits.
    assert not any(a.owns(uid) for uid in moving)
    await settle(a)
    assert all(a.owns(uid) for uid in moving)


async def test_a_member_whose_renewals_fail_fences_itself_before_the_others_consider_it_expired(
    kube: KubeClient, cluster: KubeEmulator
) -> None:
    clock_a, clock_b = Clock(), Clock()
    a, b = member(kube, "op-a", clock_a), member(kube, "op-b", clock_b)
    await tick(a, b)
    await settle(a, b)
    assert a.barrier_passed and not a.fenced
    changes: list[bool] = []
    a.subscribe(lambda: changes.append(a.fenced))
    cluster.emulator.faults.add(verb="update", resource="leases", name=a.lease_name, status=503, times=None)
    fenced_at = expired_at = None
    for step in range(1, 60):
        clock_a.now = clock_b.now = 1000.0 + step * 0.5
        await a.renew()
        a.check_fence()
        await tick(b)
        if a.fenced and fenced_at is None:
            fenced_at = clock_a.now
        if "op-a" not in b.members and expired_at is None:
            expired_at = clock_b.now
    assert fenced_at is not None and expired_at is not None
    assert fenced_at - 1000.0 <= DURATION - RENEW - 1 + 0.5
    assert expired_at - fenced_at >= RENEW
    assert True in changes and not any(a.owns(uid) for uid in UIDS)
    assert a.metrics.registry.get_sample_value("agentrun_replica_fenced", {"replica": "op-a"}) == 1
    assert b.metrics.registry.get_sample_value("agentrun_replica_members", {"replica": "op-b"}) == 1


async def test_a_member_cut_off_from_the_api_server_fences_itself_and_rejoins_behind_the_barrier(
    kube: KubeClient,
) -> None:
    clock = Clock()
    a, b = member(kube, "op-a", clock), member(kube, "op-b", clock)
    await tick(a, b)
    await settle(a, b)
    mine = [uid for uid in UIDS if a.owns(uid)]
    a.kube = dead_kube()
    try:
        clock.now += DURATION - RENEW - 1 + 0.1
        assert not await a.renew()
        assert a.fenced and not any(a.owns(uid) for uid in mine)
        await tick(b)
        assert b.members == ("op-a", "op-b")  # b has not seen a expire yet
    finally:
        await a.kube.close()
    a.kube = kube
    await tick(a, b)
    assert not a.fenced and a.members == ("op-a", "op-b")
    # A new member again: nothing is its own until the barrier passes.
    assert not any(a.owns(uid) for uid in mine)
    await settle(a, b)
    assert all(a.owns(uid) for uid in mine)


async def test_a_hanging_renewal_does_not_delay_the_fence(kube: KubeClient, cluster: KubeEmulator) -> None:
    clock = Clock()
    a = member(kube, "op-a", clock)
    await tick(a)
    await settle(a)
    cluster.emulator.faults.add(verb="update", resource="leases", status=None, delay=30, times=None)
    clock.now += DURATION - RENEW - 1 + 0.1
    loop = asyncio.create_task(a.run())
    try:
        await until(lambda: a.fenced, "the watchdog fences while the renewal hangs", timeout=3)
        assert not loop.done()
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_renewal_answered_after_the_renew_interval_but_before_the_fence_deadline_keeps_the_member(
    kube: KubeClient, cluster: KubeEmulator
) -> None:
    """A slow API server that still answers in time: the answer renews the Lease as of when the renewal
    was sent, so the member stays (no fence, its runs go on) and renews again a renew interval after it
    sent the slow one, not after the answer came (issue #29: such renewals were given up after a renew
    interval, and a loaded replica fenced itself and asked its in-flight steps again)."""
    clock = Clock()
    # Short real-time numbers: the renewal is held for real seconds while the member's clock is fake.
    settings = Settings(
        lease_namespace="default",
        replica_name="op-a",
        replica_group="g",
        lease_duration_seconds=4,
        lease_renew_seconds=0.5,
    )
    a = Membership(kube, settings, Metrics(CollectorRegistry()), clock=clock)
    await tick(a)
    await settle(a)
    tenure = a.tenure
    version = (await kube.get_lease("default", a.lease_name))["metadata"]["resourceVersion"]
    # Answered after twice the renew interval, well before the fence deadline (4 - 0.5 - 1 = 2.5 s).
    slow = cluster.emulator.faults.add(
        verb="update", resource="leases", name=a.lease_name, status=None, delay=1.0, times=1
    )
    clock.now += 0.5
    sent = clock.now
    renewing = asyncio.create_task(a.step())
    await until(lambda: slow.hits == 1, "the renewal reached the API server")
    clock.now = sent + 1.0  # what the answer takes, in the member's time
    await renewing
    assert not a.fenced and a.tenure == tenure and a.barrier_passed
    assert (await kube.get_lease("default", a.lease_name))["metadata"]["resourceVersion"] != version
    assert a.pause() == 0, "the next renewal is due a renew interval after the slow one was sent"


async def test_leave_makes_the_others_drop_the_member_at_once(kube: KubeClient) -> None:
    clock = Clock()
    a, b, c = (member(kube, name, clock) for name in ("op-a", "op-b", "op-c"))
    await tick(a, b, c)
    await b.leave()
    await tick(a, c)
    assert a.members == c.members == ("op-a", "op-c")
    assert not any(b.owns(uid) for uid in UIDS)


async def test_a_member_whose_lease_was_deleted_fences_itself_and_comes_back_as_a_new_member(
    kube: KubeClient,
) -> None:
    clock = Clock()
    a, b = member(kube, "op-a", clock), member(kube, "op-b", clock)
    await tick(a, b)
    await settle(a, b)
    await kube.delete_lease("default", a.lease_name)
    await b.observe()
    assert b.members == ("op-b",)
    assert not await a.renew()
    assert a.fenced
    assert await a.renew()
    await tick(a, b)
    assert a.members == b.members == ("op-a", "op-b") and not a.fenced


async def test_only_the_groups_leases_count(kube: KubeClient) -> None:
    clock = Clock()
    group = f"g{next(_groups)}"
    a, other = member(kube, "op-a", clock, group=group), member(kube, "op-x", clock, group="other")
    await tick(a, other)
    assert a.members == ("op-a",) and other.members == ("op-x",)
    lease = await kube.get_lease("default", a.lease_name)
    assert lease["metadata"]["labels"][GROUP_LABEL] == group
    assert lease["spec"]["holderIdentity"] == "op-a" and lease["spec"]["leaseDurationSeconds"] == DURATION


async def test_a_long_replica_name_gets_a_valid_lease(kube: KubeClient) -> None:
    clock = Clock()
    one = member(kube, "operator-" + "x" * 230 + ".example", clock)
    assert await one.renew()
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", one.lease_name)
    lease = await kube.get_lease("default", one.lease_name)
    assert lease["spec"]["holderIdentity"] == one.name


async def test_a_restarted_replica_takes_over_the_lease_its_earlier_process_left(kube: KubeClient) -> None:
    clock = Clock()
    first = member(kube, "op-a", clock)
    assert await first.renew()
    again = member(kube, "op-a", clock)
    assert await again.renew()
    await again.observe()
    assert again.members == ("op-a",)


def test_standalone_owns_every_run_and_never_changes() -> None:
    standalone: Ownership = Standalone()
    called: list[Callable[[], None]] = []
    standalone.subscribe(lambda: called.append(lambda: None))
    assert all(standalone.owns(uid) for uid in UIDS) and not standalone.fenced and not called


def test_membership_without_a_lease_namespace_is_refused(kube: KubeClient) -> None:
    with pytest.raises(ValueError, match="AGENTRUN_LEASE_NAMESPACE"):
        Membership(kube, Settings(), Metrics(CollectorRegistry()))


STALL = 30.0


def watching(kube: KubeClient, name: str, clock: Clock, loop_age: list[float]) -> Membership:
    """A member told how long ago the operator's event loop last ran (``loop_age[0]``)."""
    settings = Settings(
        lease_namespace="default",
        replica_name=name,
        replica_group="g",
        lease_duration_seconds=DURATION,
        lease_renew_seconds=RENEW,
        loop_stall_seconds=STALL,
    )
    return Membership(kube, settings, Metrics(CollectorRegistry()), clock=clock, loop_age=lambda: loop_age[0])


async def test_a_member_whose_event_loop_stalls_stops_renewing_and_fences_at_its_deadline(
    kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    clock, age = Clock(), [0.0]
    a, b = watching(kube, "op-a", clock, age), member(kube, "op-b", clock)
    await tick(a, b)
    await settle(a, b)
    tenure, renewed_at = a.tenure, clock.now
    assert tenure is not None and a.barrier_passed
    version = (await kube.get_lease("default", a.lease_name))["metadata"]["resourceVersion"]

    age[0] = STALL + 1.2
    for _ in range(3):  # the renewal round retries every second; one warning says it all
        clock.now += 1.0
        assert not await a.renew()
        assert not a.fenced
    assert (await kube.get_lease("default", a.lease_name))["metadata"]["resourceVersion"] == version
    warnings = [r.getMessage() for r in caplog.records if "has not run" in r.getMessage()]
    assert warnings == [
        "replica op-a: the operator's event loop has not run for 31.2s; not renewing its Lease so other "
        "replicas take its runs"
    ]
    clock.now = renewed_at + DURATION - RENEW - 1 - 0.1
    a.check_fence()
    assert not a.fenced and a.tenure == tenure
    clock.now += 0.2
    assert not await a.renew()  # the round itself fences once the deadline passed
    assert a.fenced and a.tenure is None and not any(a.owns(uid) for uid in UIDS)
    await tick(b)
    assert b.members == ("op-a", "op-b")  # b has not seen a's Lease expire yet: a stopped first


async def test_a_member_whose_event_loop_runs_again_renews_and_rejoins_as_a_new_member(
    kube: KubeClient,
) -> None:
    clock, age = Clock(), [0.0]
    a = watching(kube, "op-a", clock, age)
    await tick(a)
    await settle(a)
    tenure = a.tenure
    mine = [uid for uid in UIDS if a.owns(uid)]
    age[0] = STALL + 5
    clock.now += DURATION
    assert not await a.renew() and a.fenced
    age[0] = 0.4
    assert await a.renew()
    assert not a.fenced and a.tenure is not None and a.tenure != tenure
    # A new member: the barrier applies again before it runs anything.
    assert not any(a.owns(uid) for uid in mine)
    await settle(a)
    assert all(a.owns(uid) for uid in mine)


async def test_a_member_whose_event_loop_lags_below_the_stall_limit_renews(kube: KubeClient) -> None:
    clock, age = Clock(), [STALL - 0.1]
    a = watching(kube, "op-a", clock, age)
    assert await a.renew()
    version = (await kube.get_lease("default", a.lease_name))["metadata"]["resourceVersion"]
    clock.now += RENEW
    assert await a.renew()
    assert (await kube.get_lease("default", a.lease_name))["metadata"]["resourceVersion"] != version
