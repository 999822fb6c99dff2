"""The run handler under a changing ownership: only owned runs execute, handed-over runs have stopped
before the view is reported applied, and a fenced replica runs nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from prometheus_client import CollectorRegistry

from agentrun.api.spec import Approval
from agentrun.controller.agentruns.children import ChildWatch
from agentrun.controller.agentruns.handling import AgentRunHandler
from agentrun.controller.agentruns.run_control import RunControl, StopCause
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.controller.replicas.ownership import Standalone
from agentrun.kube.calling import KubeClient
from agentrun.loop.errors import HandedOff
from agentrun.metrics.definitions import Metrics
from agentrun.settings import Settings

REPLICA = "replica-a"


def run_body(uid: str, phase: str | None = None, *, iteration: int = 0, **spec: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"iterations": iteration}
    if phase:
        status |= {"phase": phase, "completionTime": dt.datetime.now(dt.UTC).isoformat()}
    return {
        "metadata": {"uid": uid, "name": f"run-{uid}", "namespace": "team", "generation": 1},
        "spec": {"task": "t", **spec},
        "status": status,
    }


class FakeOwnership:
    def __init__(self, owned: set[str]) -> None:
        self.owned = owned
        self.fenced = False
        self.term = 0
        self._changed: list[Callable[[], None]] = []

    def owns(self, uid: str) -> bool:
        return uid in self.owned

    @property
    def tenure(self) -> int | None:
        return None if self.fenced else self.term

    def subscribe(self, changed: Callable[[], None]) -> None:
        self._changed.append(changed)

    def change(self, owned: set[str] | None = None, *, fenced: bool | None = None) -> None:
        if owned is not None:
            self.owned = owned
        if fenced is not None:
            self.term += fenced and not self.fenced
            self.fenced = fenced
        for changed in self._changed:
            changed()


@dataclass
class FakeHandoff:
    """Records each applied view together with which runs were still executing at that moment."""

    view: str = "v1"
    applied_views: list[tuple[str, set[str]]] = field(default_factory=list)
    executing: Callable[[], set[str]] = set

    async def applied(self, view: str) -> None:
        self.applied_views.append((view, self.executing()))


@dataclass
class FakeKube:
    patched: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    async def patch_run_status(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self.patched.append(name)

    async def delete_run(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(name)


@dataclass
class FakeReconciler:
    """Each execution waits until cancelled; a cancelled one takes a moment to wind down, as real ones do."""

    kube: FakeKube = field(default_factory=FakeKube)
    settings: Settings = field(default_factory=lambda: Settings(replica_name=REPLICA))
    metrics: Metrics = field(default_factory=lambda: Metrics(CollectorRegistry()))
    started: list[tuple[str, int]] = field(default_factory=list)
    active: set[str] = field(default_factory=set)

    # Runs in their loop: each goes on to its checkpoint (when the test sets `checkpoint`) once asked
    # to yield; the others are waiting before their loop and have nothing to finish.
    in_loop: set[str] = field(default_factory=set)
    checkpoint: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: list[str] = field(default_factory=list)
    yielded: list[str] = field(default_factory=list)
    controls: dict[str, RunControl] = field(default_factory=dict)
    causes: dict[str, StopCause | None] = field(default_factory=dict)

    async def reconcile(self, ref: RunObject, control: RunControl, *, log: Any) -> None:
        self.controls[ref.uid] = control
        self.started.append((ref.uid, ref.status.iterations))
        self.active.add(ref.uid)
        control.looping = ref.uid in self.in_loop
        try:
            if control.looping:
                await control.checkpoint.wait()
                await self.checkpoint.wait()  # the step in flight is recorded
                self.yielded.append(ref.uid)
                self.causes[ref.uid] = control.why()
                raise HandedOff()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(ref.uid)
            self.causes[ref.uid] = control.why()
            raise
        finally:
            await asyncio.shield(asyncio.sleep(0.05))  # winding down: the task has not ended yet
            self.active.discard(ref.uid)

    def update_priority(self, uid: str, priority: int) -> None: ...
    def update_approvals(self, uid: str, entries: Sequence[Approval]) -> None: ...


def handler_of(
    reconciler: FakeReconciler, ownership: FakeOwnership | Standalone, handoff: FakeHandoff | None = None
) -> AgentRunHandler:
    handler = AgentRunHandler(
        reconciler,
        kube=cast(KubeClient, reconciler.kube),
        child_watch=ChildWatch(),
        metrics=reconciler.metrics,
        settings=reconciler.settings,
        ownership=ownership,
        handoff=handoff,
    )
    if handoff is not None:
        handoff.executing = lambda: set(reconciler.active)
    return handler


async def settle(seconds: float = 0.2) -> None:
    await asyncio.sleep(seconds)


def counted(metrics: Metrics, direction: str) -> float:
    return metrics.replica_handoffs.labels(REPLICA, direction)._value.get()


async def test_a_run_owned_elsewhere_is_kept_and_starts_from_its_newest_body_when_it_moves_here() -> None:
    reconciler, ownership = FakeReconciler(), FakeOwnership(owned={"mine"})
    handoff = FakeHandoff()
    handler = handler_of(reconciler, ownership, handoff)
    await handler.observe(None, run_body("mine"))
    await handler.observe(None, run_body("theirs"))
    await handler.observe("MODIFIED", run_body("theirs", iteration=3))
    await settle()
    assert reconciler.started == [("mine", 0)]

    ownership.change(owned={"mine", "theirs"})
    await settle()
    assert reconciler.started == [("mine", 0), ("theirs", 3)], "resumed from the newest body seen"
    assert handoff.applied_views[-1][0] == "v1"
    assert counted(reconciler.metrics, "in") == 1
    await handler.close()


async def test_a_run_handed_over_has_ended_before_the_view_is_reported_applied() -> None:
    reconciler, ownership = FakeReconciler(), FakeOwnership(owned={"a", "b"})
    handoff = FakeHandoff()
    handler = handler_of(reconciler, ownership, handoff)
    for uid in ("a", "b"):
        await handler.observe(None, run_body(uid))
    await settle()
    assert reconciler.active == {"a", "b"}

    handoff.view = "v2"
    ownership.change(owned={"a"})
    await settle(0.5)
    assert handoff.applied_views == [("v2", {"a"})], "b still executed when v2 was reported applied"
    assert handler.supervisor.executing() == {"a"}
    assert counted(reconciler.metrics, "out") == 1

    # A later event of the run it gave up does not start it again here.
    await handler.observe("MODIFIED", run_body("b", iteration=1))
    await settle()
    assert [uid for uid, _ in reconciler.started] == ["a", "b"]
    await handler.close()


async def test_a_view_that_changed_while_runs_stopped_is_not_reported_applied() -> None:
    reconciler, ownership = FakeReconciler(), FakeOwnership(owned={"a"})
    handoff = FakeHandoff()
    handler = handler_of(reconciler, ownership, handoff)
    await handler.observe(None, run_body("a"))
    await settle()

    handoff.view = "v2"
    ownership.change(owned=set())
    await asyncio.sleep(0.01)  # run a winds down; meanwhile the view moves on
    handoff.view = "v3"
    ownership.change()
    await settle(0.5)
    assert [view for view, _ in handoff.applied_views] == ["v3"]
    await handler.close()


async def test_a_fenced_replica_stops_every_run_and_starts_none_until_it_is_unfenced() -> None:
    reconciler, ownership = FakeReconciler(), FakeOwnership(owned={"a", "b"})
    handler = handler_of(reconciler, ownership)
    for uid in ("a", "b"):
        await handler.observe(None, run_body(uid))
    await settle()
    ownership.change(fenced=True)
    await settle()
    assert handler.supervisor.executing() == set()
    await handler.observe(None, run_body("c"))
    ownership.owned.add("c")
    await handler.observe("MODIFIED", run_body("c"))
    await settle()
    assert [uid for uid, _ in reconciler.started] == ["a", "b"]

    ownership.change(fenced=False)
    await settle()
    assert handler.supervisor.executing() == {"a", "b", "c"}
    await handler.close()


async def test_a_finished_run_is_reaped_and_marked_only_by_its_owner_and_its_deletion_moves_with_it() -> None:
    reconciler, ownership = FakeReconciler(), FakeOwnership(owned=set())
    handler = handler_of(reconciler, ownership)
    body = run_body("done", "Succeeded", ttlSecondsAfterFinished=3600)
    body["metadata"]["generation"] = 2  # a spec change after the end: the owner marks it observed
    body["status"]["observedGeneration"] = 1
    await handler.observe(None, body)
    await handler.observe(None, run_body("no-ttl", "Succeeded"))
    await settle()
    assert handler.reaper.scheduled == 0
    assert reconciler.kube.patched == []
    assert set(handler.rebalancer.finished) == {"done"}, "only runs with a TTL are kept"

    ownership.change(owned={"done"})
    await settle()
    assert handler.reaper.scheduled == 1
    ownership.change(owned=set())
    await settle()
    assert handler.reaper.scheduled == 0

    ownership.change(owned={"done"})
    await handler.observe("MODIFIED", body)
    assert reconciler.kube.patched == ["run-done"]
    await handler.observe("DELETED", body)
    assert handler.reaper.scheduled == 0 and not handler.rebalancer.finished
    await handler.close()


async def test_a_deleted_run_is_forgotten_and_not_started_when_ownership_later_moves_here() -> None:
    reconciler, ownership = FakeReconciler(), FakeOwnership(owned=set())
    handler = handler_of(reconciler, ownership)
    await handler.observe(None, run_body("gone"))
    await handler.observe("DELETED", run_body("gone"))
    ownership.change(owned={"gone"})
    await settle()
    assert reconciler.started == []
    assert handler.rebalancer.unfinished == {}
    await handler.close()


async def test_standalone_owns_every_run_and_never_reports_a_view() -> None:
    reconciler = FakeReconciler()
    handler = handler_of(reconciler, Standalone())
    await handler.observe(None, run_body("a"))
    await settle()
    assert reconciler.started == [("a", 0)]
    await handler.close()
    assert reconciler.active == set()


async def test_a_run_handed_over_in_its_loop_reaches_its_checkpoint_before_the_view_is_reported_applied() -> (
    None
):
    reconciler, ownership = FakeReconciler(in_loop={"a"}), FakeOwnership(owned={"a", "b"})
    handoff = FakeHandoff()
    handler = handler_of(reconciler, ownership, handoff)
    for uid in ("a", "b"):
        await handler.observe(None, run_body(uid))
    await settle()

    handoff.view = "v2"
    ownership.change(owned=set())
    await settle(0.3)
    # b was not in its loop: stopped at once. a finishes its step first; the view waits for it.
    assert reconciler.cancelled == ["b"]
    assert handoff.applied_views == [] and handler.supervisor.executing() == {"a"}

    reconciler.checkpoint.set()
    await settle(0.3)
    assert reconciler.yielded == ["a"] and reconciler.cancelled == ["b"], "a was cut off mid-step"
    assert reconciler.causes == {"a": StopCause.HANDED_OFF, "b": StopCause.HANDED_OFF}
    assert handoff.applied_views == [("v2", set())]

    # Yielded is not ended: when the run comes back here, it is started again.
    handoff.view = "v3"
    ownership.change(owned={"a"})
    await settle()
    assert [uid for uid, _ in reconciler.started] == ["a", "b", "a"]
    await handler.close()


async def test_a_run_that_does_not_reach_its_checkpoint_within_the_grace_is_stopped_where_it_is() -> None:
    reconciler = FakeReconciler(
        in_loop={"a"}, settings=Settings(replica_name=REPLICA, handoff_grace_seconds=0.3)
    )
    ownership, handoff = FakeOwnership(owned={"a"}), FakeHandoff()
    handler = handler_of(reconciler, ownership, handoff)
    await handler.observe(None, run_body("a"))
    await settle()

    handoff.view = "v2"
    ownership.change(owned=set())
    await settle(0.15)
    assert reconciler.cancelled == [] and handoff.applied_views == []
    await settle(0.5)
    assert reconciler.cancelled == ["a"] and reconciler.yielded == []
    assert handoff.applied_views == [("v2", set())]
    await handler.close()


async def test_a_replica_fenced_while_its_runs_go_on_to_their_checkpoints_stops_them_at_once() -> None:
    reconciler, ownership = FakeReconciler(in_loop={"a"}), FakeOwnership(owned={"a"})
    handoff = FakeHandoff()
    handler = handler_of(reconciler, ownership, handoff)
    await handler.observe(None, run_body("a"))
    await settle()
    handoff.view = "v2"
    ownership.change(owned=set())
    await settle(0.1)
    assert reconciler.cancelled == []  # going on to its checkpoint (the grace is 30 s)

    ownership.change(fenced=True)
    await settle()
    assert reconciler.cancelled == ["a"] and handler.supervisor.executing() == set()
    assert reconciler.causes["a"] is StopCause.FENCED
    await handler.close()


async def test_a_shutdown_with_replicas_lets_runs_reach_their_checkpoints_and_alone_stops_them_at_once() -> (
    None
):
    reconciler, ownership = FakeReconciler(in_loop={"a"}), FakeOwnership(owned={"a"})
    handler = handler_of(reconciler, ownership, FakeHandoff())
    await handler.observe(None, run_body("a"))
    await settle()
    closing = asyncio.create_task(handler.close())
    await settle(0.1)
    assert not closing.done() and reconciler.cancelled == []
    reconciler.checkpoint.set()
    await asyncio.wait_for(closing, 2)
    assert reconciler.yielded == ["a"] and reconciler.cancelled == []
    assert reconciler.causes["a"] is StopCause.SHUTTING_DOWN

    alone, standalone = FakeReconciler(in_loop={"a"}), FakeOwnership(owned={"a"})
    handler = handler_of(alone, standalone)
    await handler.observe(None, run_body("a"))
    await settle()
    await asyncio.wait_for(handler.close(), 2)
    assert alone.cancelled == ["a"] and alone.yielded == []


async def test_a_run_started_before_its_replicas_membership_lapsed_is_no_longer_held_and_is_stopped() -> None:
    reconciler, ownership = FakeReconciler(in_loop={"a"}), FakeOwnership(owned={"a"})
    handler = handler_of(reconciler, ownership, FakeHandoff())
    await handler.observe(None, run_body("a"))
    await settle()
    control = reconciler.controls["a"]
    assert control.held() and not control.silenced()
    # The membership thread fenced and rejoined; this loop has not heard of it yet.
    ownership.term += 1
    assert not control.held() and control.silenced()
    await settle()
    assert reconciler.cancelled == ["a"] and handler.supervisor.executing() == set()
    assert reconciler.causes["a"] is StopCause.FENCED
    await handler.close()


async def test_a_replica_that_rejoined_before_hearing_of_its_fence_stops_its_runs_at_once() -> None:
    reconciler, ownership = FakeReconciler(in_loop={"a"}), FakeOwnership(owned={"a"})
    handoff = FakeHandoff()
    handler = handler_of(reconciler, ownership, handoff)
    await handler.observe(None, run_body("a"))
    await settle()
    # Fenced and back as a new member by the time the change is heard: not fenced, owns nothing yet. The
    # others may have resumed the run meanwhile, so it must not go on to its checkpoint (grace 30 s).
    ownership.term += 1
    handoff.view = "v2"
    ownership.change(owned=set())
    await settle()
    assert reconciler.cancelled == ["a"] and reconciler.yielded == []
    assert handoff.applied_views == [("v2", set())]
    await handler.close()


async def test_alone_a_run_has_no_hold_to_check() -> None:
    reconciler, ownership = FakeReconciler(), FakeOwnership(owned={"a"})
    handler = handler_of(reconciler, ownership)  # no membership: no handoff barrier, nothing to lapse
    await handler.observe(None, run_body("a"))
    await settle()
    ownership.term += 1
    assert reconciler.controls["a"].held() and reconciler.controls["a"].why() is None
    await handler.close()
