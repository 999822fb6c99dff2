"""Replicas sharing the runs (controller/replicas/): each unfinished run executed by exactly one replica at
a time, through joins, graceful leaves, SIGKILLs and a replica cut off from the API server.

Every replica is a real operator process with a Lease in the test's namespace, a group name of the
test's own and short leases (tests/support/replicas.py). Which replica asked the model for which step
of which run comes from the fake Messages API's log: each replica has its own API key, and each
request carries the run's uid as metadata.user_id.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from agentrun.controller.replicas.ring import lease_name
from agentrun_sandbox.messages.api import FakeMessagesAPI, RecordedRequest
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.integration.test_durable_runs import Webhook, assert_consistent, webhook_manifest
from tests.integration.test_load_and_crashes import _create_all, _wait_all_finished
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import until
from tests.support.replicas import LEASE_DURATION_SECONDS, ReplicaGroup, cuttable_link, replica_group
from tests.support.transcript_stores import EACH_STORE, StoreUnderTest

# Several operators each, failovers timed against lease durations: started first in a parallel run
# (tests/conftest.py), one after another on one worker (as every file's tests are).
pytestmark = pytest.mark.slow

FINISHED = ("Succeeded", "Failed", "Cancelled")
#: A failed-over run continues within the Lease duration plus this (the replicas poll their group's
#: Leases every renewal; a loaded machine or a real server adds a few seconds).
FAILOVER_SLACK_SECONDS = 8.0
#: Tool steps of a run while the group grows (at the third) and shrinks (at the seventh).
SCALE_STEPS = 10
#: A replica whose event loop has not run for this long stops renewing its Lease (the default is 30 s).
LOOP_STALL_SECONDS = 2.0
#: How long the stuck replica's event loop is blocked: well past the stall limit plus the Lease.
STUCK_SECONDS = 25


def share_script(tag: str) -> Script:
    return Script(
        tag,
        [
            Reply([tool_use_block("calculator", {"expression": "2+2"}, id="toolu_share1")]),
            Reply([text_block("4")]),
        ],
    )


def steps_script(tag: str, steps: int) -> Script:
    """``steps`` webhook calls (ids toolu_w1..), then an answer: a run long enough to be caught mid-way."""
    replies = [Reply([tool_use_block("record", {"step": i + 1}, id=f"toolu_w{i + 1}")]) for i in range(steps)]
    return Script(tag, [*replies, Reply([text_block("all recorded")])])


class GatedWebhook(Webhook):
    """The webhook tool, with gates: the first call of a gated tool_use id, in every run, waits until
    its gate opens. A scenario holds every run in one step with it, so a replica joins or leaves while
    each run is in the middle of a step (not before the runs started, nor after they finished)."""

    def __init__(self, *gated: str) -> None:
        super().__init__()
        self.gates = {tool_id: asyncio.Event() for tool_id in gated}

    async def handle(self, request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        body = await request.json()
        first = key not in self.keys
        self.keys.append(key)
        gate = self.gates.get(key.rpartition(":")[2])
        if gate is not None and first:
            await gate.wait()
        return web.json_response({"recorded": body, "key": key})

    def arrived(self, tool_id: str) -> int:
        """How many runs called ``tool_id`` (at a gate: how many wait there)."""
        return len({key for key in self.keys if key.rpartition(":")[2] == tool_id})

    async def stop(self) -> None:
        for gate in self.gates.values():
            gate.set()
        await super().stop()


def assert_no_replica_fenced(group: ReplicaGroup) -> None:
    """A fenced replica stops its runs where they are (docs/replicas.md, Fencing), so the steps they
    had in flight are asked again: said first, so such a failure is not read as a handoff's."""
    for name, replica in {**group.stopped, **group.replicas}.items():
        fences = [line for line in replica.process.logs().splitlines() if "fences itself" in line]
        assert not fences, (
            f"{name} fenced itself, so its runs repeated the steps they had in flight: {fences}"
        )


def share_manifests(cluster: TestCluster, tag: str, count: int) -> list[dict[str, Any]]:
    return [
        agentrun(
            f"share-{i:02d}",
            f"{tag} run {i}",
            namespace=cluster.namespace,
            model={"name": "claude-haiku-4-5"},
            tools=[{"builtin": {"name": "calculator"}}],
        )
        for i in range(count)
    ]


async def create_webhook_runs(
    cluster: TestCluster, prefix: str, tag: str, hook: Webhook, count: int, *, max_iterations: int
) -> None:
    manifests = [webhook_manifest(cluster, f"{prefix}-{i:02d}", tag, hook) for i in range(count)]
    for manifest in manifests:
        manifest["spec"]["limits"] = {"maxIterations": max_iterations}
    await _create_all(cluster, manifests)


async def until_mid_run(group: ReplicaGroup, model: FakeMessagesAPI, tag: str, *replicas: str) -> str:
    """Until one of ``replicas`` is in the middle of one of its runs (it asked for a run's step 2 or
    later): that one, the first to get there."""

    def first_mid_run() -> str | None:
        for request in model.requests_for(tag):
            if (request.step or 0) >= 2 and (replica := group.replica_of(request)) in replicas:
                return replica
        return None

    found: str = await until(
        first_mid_run,
        f"one of {replicas} to get to the middle of a run",
        60,
        explain=lambda _: progress(group, model, tag),
    )
    return found


def progress(group: ReplicaGroup, model: FakeMessagesAPI, tag: str) -> str:
    """What each replica asked the model for so far, and the membership lines of its log: why a
    replica did not get as far as a test waited for."""
    asked: dict[str, Counter[int]] = defaultdict(Counter)
    for request in model.requests_for(tag):
        asked[group.replica_of(request)][request.step or 0] += 1
    lines = [f"{name}: steps asked {dict(sorted(asked[name].items()))}" for name in group.replicas]
    for name, replica in group.replicas.items():
        log = [line for line in replica.process.logs().splitlines() if "replica" in line or "Error" in line]
        lines += [f"--- {name}'s log (membership lines, last 30) ---", *log[-30:]]
    return "\n".join(lines)


async def until_asked(group: ReplicaGroup, model: FakeMessagesAPI, tag: str, replica: str) -> None:
    """Until ``replica`` asked the model for a step of one of the runs."""
    await until(
        lambda: any(group.replica_of(r) == replica for r in model.requests_for(tag)),
        f"{replica} to ask the model for a step",
        60,
        explain=lambda _: progress(group, model, tag),
    )


def by_run(requests: list[RecordedRequest]) -> dict[str, list[RecordedRequest]]:
    found: dict[str, list[RecordedRequest]] = defaultdict(list)
    for request in sorted(requests, key=lambda r: r.arrived_at):
        if request.step is not None:
            found[request.body["metadata"]["user_id"]].append(request)
    return found


def assert_never_back(group: ReplicaGroup, requests: dict[str, list[RecordedRequest]]) -> None:
    """A run's requests come from one replica after another, never back to an earlier one: two replicas
    never asked for one run at the same time."""
    for uid, asked in requests.items():
        order = [group.replica_of(r) for r in asked]
        runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]
        assert len(runs) == len(set(runs)), f"run {uid} went back and forth between replicas: {order}"


def assert_one_step_after_another(group: ReplicaGroup, requests: dict[str, list[RecordedRequest]]) -> None:
    """A run's steps are asked in order, a step again only right after the run changed replicas: two
    replicas executing one run at once would interleave their steps."""
    for uid, asked in requests.items():
        trail = [(r.step or 0, group.replica_of(r)) for r in asked]
        for (step, replica), (next_step, next_replica) in itertools.pairwise(trail):
            assert next_step == step + 1 or (next_step == step and next_replica != replica), (
                f"run {uid}: steps out of order or asked twice by one replica: {trail}"
            )


async def assert_succeeded_whole(store: StoreUnderTest, found: dict[str, Any], iterations: int) -> None:
    """Every run succeeded after ``iterations`` iterations, its transcript consistent and complete."""
    for name, obj in found.items():
        status, uid = obj["status"], obj["metadata"]["uid"]
        outcome = (status["phase"], status["result"], status["iterations"])
        assert outcome == ("Succeeded", "all recorded", iterations), name
        assert status["transcript"]["kind"] == store.status_kind, name
        transcript = await store.transcript(uid)
        assert_consistent(transcript)
        assert [row.iteration for row in transcript.trace_rows] == list(range(1, iterations + 1)), name


def assert_done_once(
    found: dict[str, Any],
    hook: Webhook,
    requests: dict[str, list[RecordedRequest]],
    *,
    tool_calls: int,
    repeatable: set[str],
) -> None:
    """Every tool call reached the webhook and every step was asked; only a run in ``repeatable`` (its
    step was in flight at the fault) may have made that one step or call twice (same Idempotency-Key)."""
    for name, obj in found.items():
        uid = obj["metadata"]["uid"]
        keys = Counter(k for k in hook.keys if k.startswith(f"{uid}:"))
        assert set(keys) == {f"{uid}:toolu_w{i}" for i in range(1, tool_calls + 1)}, name
        limit = 2 if uid in repeatable else 1
        assert max(keys.values()) <= limit, (name, keys)
        steps = Counter(r.step for r in requests[uid])
        assert max(steps.values()) <= limit, (name, steps)


async def test_two_and_three_replicas_share_the_runs_and_each_step_is_asked_exactly_once(
    cluster: TestCluster, tmp_path: Path
) -> None:
    runs_per_round = 30
    async with (
        FakeMessagesAPI(scripts=[share_script("[share]")], latency_seconds=0.2).running() as model,
        replica_group(cluster, model, tmp_path) as group,
    ):
        for count, first in ((2, 0), (3, runs_per_round)):
            while len(group.replicas) < count:
                await group.start(f"r{len(group.replicas)}")
            await group.wait_for_members(count)
            manifests = share_manifests(cluster, f"[share] {count} replicas", runs_per_round)
            for index, manifest in enumerate(manifests):
                manifest["metadata"]["name"] = f"share-{first + index:02d}"
            await _create_all(cluster, manifests)
            runs = await _wait_all_finished(cluster, first + runs_per_round, timeout=180)

            outcomes = Counter((r["status"]["phase"], r["status"].get("result")) for r in runs.values())
            assert outcomes == Counter({("Succeeded", "4"): first + runs_per_round})
            round_requests = model.requests_for(f"[share] {count} replicas")
            asked = Counter((r.body["metadata"]["user_id"], r.step) for r in round_requests)
            assert len(asked) == 2 * runs_per_round and set(asked.values()) == {1}, asked
            executed_by = {group.replica_of(r) for r in round_requests}
            assert len(executed_by) > 1, f"{count} replicas, but only {executed_by} executed runs"
            # Steady membership: every run stayed with the replica that started it.
            for uid, asked_for in by_run(round_requests).items():
                assert len({group.replica_of(r) for r in asked_for}) == 1, uid


@EACH_STORE
async def test_a_sigkilled_replicas_runs_continue_on_the_others_within_the_lease_duration(
    cluster: TestCluster, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    hook = Webhook()
    await hook.start()
    tag, runs = "[failover]", 12
    try:
        async with (
            FakeMessagesAPI(scripts=[steps_script(tag, 6)], latency_seconds=0.5).running() as model,
            replica_group(cluster, model, tmp_path, transcript_store.env) as group,
        ):
            for name in ("r0", "r1", "r2"):
                await group.start(name)
            await group.wait_for_members(3)
            await create_webhook_runs(cluster, "failover", tag, hook, runs, max_iterations=10)
            # Kill a replica once it is in the middle of its runs (one of its runs asked for step 2): the
            # first to get there, as the hash may give one of three replicas none of 12 runs (0.8%).
            victim = await until_mid_run(group, model, tag, "r0", "r1", "r2")
            await group.stop(victim, kill=True)
            killed_at = time.time()
            found = await _wait_all_finished(cluster, runs, timeout=180)
    finally:
        await hook.stop()

    requests = by_run(model.requests_for(tag))
    orphaned = {uid: asked for uid, asked in requests.items() if group.replica_of(asked[0]) == victim}
    interrupted = {uid for uid, asked in orphaned.items() if {group.replica_of(r) for r in asked} != {victim}}
    assert interrupted, f"{victim} was killed with none of its runs unfinished"
    assert_never_back(group, requests)
    for uid in interrupted:
        resumed = min(r.arrived_at for r in requests[uid] if group.replica_of(r) != victim)
        assert resumed - killed_at <= LEASE_DURATION_SECONDS + FAILOVER_SLACK_SECONDS, (
            f"run {uid} resumed {resumed - killed_at:.1f}s after the kill"
        )
    await assert_succeeded_whole(transcript_store, found, 7)
    # Only the call in flight at the kill may run again, once.
    assert_done_once(found, hook, requests, tool_calls=6, repeatable=interrupted)


@pytest.mark.timeout(300)
async def test_scaling_one_to_three_to_one_during_a_load_loses_and_repeats_nothing(
    cluster: TestCluster, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    # Every run waits in its third tool call while the group grows, and in its seventh while it
    # shrinks: each handoff then happens in the middle of a step, whatever the machine's speed (a
    # loaded machine started r1 and r2 after the runs had finished, and nothing moved).
    grow_at, shrink_at = "toolu_w3", "toolu_w7"
    hook = GatedWebhook(grow_at, shrink_at)
    await hook.start()
    tag, runs = "[scale]", 30
    try:
        async with (
            FakeMessagesAPI(scripts=[steps_script(tag, SCALE_STEPS)], latency_seconds=0.5).running() as model,
            replica_group(cluster, model, tmp_path, transcript_store.env) as group,
        ):
            await group.start("r0")
            await group.wait_for_members(1)
            await create_webhook_runs(cluster, "scale", tag, hook, runs, max_iterations=SCALE_STEPS + 2)
            await until(lambda: hook.arrived(grow_at) == runs, "every run in its third tool call", timeout=90)
            await asyncio.gather(group.start("r1"), group.start("r2"))
            await group.wait_for_members(3)
            # r0 lets the runs it lost finish their tool call (their checkpoint) and only then hands
            # them over; r1 and r2 resume them from there.
            hook.gates[grow_at].set()
            await asyncio.gather(*(until_asked(group, model, tag, name) for name in ("r1", "r2")))
            await until(
                lambda: hook.arrived(shrink_at) == runs, "every run in its seventh tool call", timeout=90
            )
            # SIGTERM: r1 and r2 stop their runs at the next checkpoint (the end of the tool call they
            # are in), delete their Leases, and r0 takes the runs back.
            leaving = [group.replicas["r1"].process, group.replicas["r2"].process]
            stopping = asyncio.gather(group.stop("r1"), group.stop("r2"))
            await until(
                lambda: all("SIGTERM is received" in process.logs() for process in leaving),
                "r1 and r2 shutting down",
            )
            hook.gates[shrink_at].set()
            await stopping
            await group.wait_for_members(1)
            found = await _wait_all_finished(cluster, runs, timeout=180)
    finally:
        await hook.stop()

    assert_no_replica_fenced(group)
    requests = by_run(model.requests_for(tag))
    assert_one_step_after_another(group, requests)
    moved = {uid for uid, asked in requests.items() if len({group.replica_of(r) for r in asked}) > 1}
    assert moved, "no run changed replicas while the group grew and shrank"
    await assert_succeeded_whole(transcript_store, found, SCALE_STEPS + 1)
    # A handoff lets the old owner finish the step in flight (its answer or its tool results are
    # checkpointed) before the new owner resumes: no model request and no tool call is made twice.
    assert_done_once(found, hook, requests, tool_calls=SCALE_STEPS, repeatable=set())
    for name, obj in found.items():
        uid = obj["metadata"]["uid"]
        steps = Counter(r.step for r in requests[uid])
        assert sorted(steps) == list(range(SCALE_STEPS + 1)), (name, steps)
        positions = Counter(len(r.body["messages"]) for r in requests[uid])
        assert set(positions.values()) == {1}, (name, "a conversation position asked twice", positions)


@pytest.mark.emulator_only("the API server's slow answers to one replica's Lease renewals are injected")
async def test_a_replica_whose_lease_renewals_are_answered_late_but_in_time_keeps_its_runs(
    cluster: TestCluster, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    """An API server that answers a replica's renewals after more than a renew interval, but well within
    its Lease: the replica stays a member, and its runs go on without repeating a step. (Issue #29: such
    renewals were given up after a renew interval; under load the replica fenced itself, stopped its
    runs where they were, and each asked its in-flight step again.)"""
    hook = GatedWebhook("toolu_w2")
    await hook.start()
    tag, runs = "[slow-renewals]", 6
    # A longer Lease than the group's: the fence deadline (10 - 1 - 1 = 8 s after a renewal was sent)
    # leaves room for a loaded machine on top of the injected delay.
    lease = {"AGENTRUN_LEASE_DURATION_SECONDS": "10"}
    try:
        async with (
            FakeMessagesAPI(scripts=[steps_script(tag, 4)], latency_seconds=0.2).running() as model,
            replica_group(cluster, model, tmp_path, transcript_store.env) as group,
        ):
            await group.start("r0", env=lease)
            await group.wait_for_members(1)
            await create_webhook_runs(cluster, "slow", tag, hook, runs, max_iterations=6)
            # Every run in the middle of a step (its second tool call) while the renewals are slow.
            await until(lambda: hook.arrived("toolu_w2") == runs, "every run in its second tool call")
            emulator = cluster.emulator
            assert emulator is not None
            slow = emulator.faults.add(
                verb="update",
                resource="leases",
                name=lease_name(group.group, "r0"),
                status=None,
                delay=1.5,  # the renew interval is 1 s
                times=None,
            )
            # Slow renewals for longer than the fence deadline: 6 answers of 1.5 s and more.
            await until(lambda: slow.hits >= 6, "six slow renewals", timeout=60)
            emulator.faults.rules.remove(slow)
            hook.gates["toolu_w2"].set()
            found = await _wait_all_finished(cluster, runs, timeout=120)
    finally:
        await hook.stop()

    assert_no_replica_fenced(group)
    requests = by_run(model.requests_for(tag))
    await assert_succeeded_whole(transcript_store, found, 5)
    assert_done_once(found, hook, requests, tool_calls=4, repeatable=set())


@pytest.mark.timeout(300)
async def test_a_replica_cut_off_from_the_api_server_stops_calling_the_model_before_others_take_over(
    cluster: TestCluster, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    hook = Webhook()
    await hook.start()
    tag, runs = "[partition]", 10
    try:
        async with (
            FakeMessagesAPI(scripts=[steps_script(tag, 8)], latency_seconds=0.5).running() as model,
            replica_group(cluster, model, tmp_path, transcript_store.env) as group,
            cuttable_link(cluster) as link,
        ):
            await group.start("cut", kubeconfig=link.kubeconfig(cluster))
            await group.start("kept")
            await group.wait_for_members(2)
            await create_webhook_runs(cluster, "partition", tag, hook, runs, max_iterations=12)
            await until_mid_run(group, model, tag, "cut")
            link.cut()
            cut_at = time.time()
            found = await _wait_all_finished(cluster, runs, timeout=180)
            fenced_log = group.replicas["cut"].process.logs()
    finally:
        await hook.stop()

    assert "fences itself" in fenced_log, "the cut-off replica did not fence itself"
    requests = by_run(model.requests_for(tag))
    assert_never_back(group, requests)
    taken_over = {
        uid
        for uid, asked in requests.items()
        if group.replica_of(asked[0]) == "cut" and any(group.replica_of(r) == "kept" for r in asked)
    }
    assert taken_over, "none of the cut-off replica's runs was taken over"
    last_by_cut = max(
        r.arrived_at for asked in requests.values() for r in asked if group.replica_of(r) == "cut"
    )
    assert last_by_cut - cut_at < LEASE_DURATION_SECONDS, "the cut-off replica kept calling the model"
    for uid in taken_over:
        first_by_kept = min(r.arrived_at for r in requests[uid] if group.replica_of(r) == "kept")
        assert first_by_kept > last_by_cut, f"run {uid}: both replicas called the model for it"
    await assert_succeeded_whole(transcript_store, found, 9)


@pytest.mark.timeout(300)
async def test_a_replica_whose_event_loop_is_stuck_lets_the_others_take_its_runs_and_rejoins_after(
    cluster: TestCluster, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    hook = Webhook()
    await hook.start()
    tag, runs = "[stuck]", 10
    try:
        async with (
            FakeMessagesAPI(scripts=[steps_script(tag, 8)], latency_seconds=0.5).running() as model,
            replica_group(cluster, model, tmp_path, transcript_store.env) as group,
        ):
            # A small stall limit for the replica that gets stuck only: the other keeps the default, so a
            # loaded test machine's loop lag cannot make it let go of its Lease.
            stuck = await group.start(
                "stuck",
                env={
                    "AGENTRUN_LOOP_STALL_SECONDS": str(LOOP_STALL_SECONDS),
                    # The documented test-only variable (docs/operating.md), by its name.
                    "AGENTRUN_FAULT_STALL_LOOP_SECONDS": str(STUCK_SECONDS),
                },
            )
            await group.start("kept")
            await group.wait_for_members(2)
            await create_webhook_runs(cluster, "stuck", tag, hook, runs, max_iterations=12)
            await until_mid_run(group, model, tag, "stuck")
            # Its event loop blocks (a test-only hook: time.sleep on the loop); its membership thread lives.
            assert stuck.process.process is not None
            stuck.process.process.send_signal(signal.SIGUSR1)
            stuck_at = time.time()
            found = await _wait_all_finished(cluster, runs, timeout=180)
            # Back from the stall, it renews again and rejoins as a new member.
            await group.wait_for_members(2, timeout=STUCK_SECONDS + 60)
            stuck_log = stuck.process.logs()
    finally:
        await hook.stop()

    assert "the operator's event loop has not run for" in stuck_log, stuck_log[-3000:]
    assert "fences itself" in stuck_log and "rejoins its group" in stuck_log
    requests = by_run(model.requests_for(tag))
    # Two replicas never asked for one run at once (a run may move back once the stuck one rejoined).
    assert_one_step_after_another(group, requests)
    taken_over = {
        uid
        for uid, asked in requests.items()
        if group.replica_of(asked[0]) == "stuck" and any(group.replica_of(r) == "kept" for r in asked)
    }
    assert taken_over, "none of the stuck replica's runs was taken over"
    for uid in taken_over:
        trail = [(r.arrived_at, group.replica_of(r)) for r in requests[uid]]
        first_by_kept = min(at for at, name in trail if name == "kept")
        assert (
            first_by_kept - stuck_at <= LOOP_STALL_SECONDS + LEASE_DURATION_SECONDS + FAILOVER_SLACK_SECONDS
        ), f"run {uid} resumed {first_by_kept - stuck_at:.1f}s after the loop got stuck"
        # Nothing from the stuck replica between the stall and the takeover, nor right after it resumed.
        assert not [at for at, name in trail if name == "stuck" and stuck_at + 1 < at < first_by_kept], trail
    await assert_succeeded_whole(transcript_store, found, 9)
    # Only the step in flight when the loop got stuck may be asked (or called) again, once.
    assert_done_once(found, hook, requests, tool_calls=8, repeatable=taken_over)
