"""The replica benchmark's figures, computed from what was recorded, whichever server served the run.

Both modes (the emulator in the bench process, a real API server behind the recording proxy) reduce what
they saw to the same records: every operator request with the replica that sent it, every model request
with the replica that sent it and the iteration it asks for, the runs' objects and when each turned
terminal. Everything here is a pure function of those records, so what a figure means is decided (and
tested) once for both modes.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun.controller.replicas.ring import owner
from agentrun_sandbox.messages.recording import RecordedRequest

UNKNOWN = "?"
"""The replica of a request whose credential names none of them (not expected: every replica has one)."""


def attribute(credential: str | None, replicas: Mapping[str, str]) -> str:
    """The replica a credential (an ``Authorization`` header, an API key) belongs to."""
    return replicas.get(credential or "", UNKNOWN)


@dataclass(frozen=True)
class OperatorRequest:
    """One Kubernetes API request a replica sent, as the emulator or the proxy recorded it."""

    at: float
    replica: str
    kind: str
    """The breakdown label, e.g. ``PATCH agentruns/status``."""
    is_write: bool
    status: int | None
    """The server's answer (None: not answered, e.g. the replica was killed while waiting)."""
    run: str | None
    """The AgentRun this request writes (its name), if it writes one."""


@dataclass(frozen=True)
class ModelRequest:
    """One Messages API request: which run, from which replica, for which iteration."""

    at: float
    run: str
    replica: str
    step: int
    """Assistant turns already in the conversation: the iteration this request is (0 = the first)."""


def model_request(recorded: RecordedRequest, keys: Mapping[str, str], prefix: str) -> ModelRequest | None:
    """A scripted answer's request, as the run (``<prefix>-NNNNN`` for the ``run-NNNNN`` its task names)
    and replica (by its API key) that sent it; None for anything else the fake API saw."""
    _, found, number = recorded.first_user_text.partition("run-")
    if recorded.outcome != "reply" or not found or recorded.step is None:
        return None
    return ModelRequest(
        at=recorded.arrived_at,
        run=f"{prefix}-{number[:5]}",
        replica=attribute(recorded.headers.get("x-api-key"), keys),
        step=recorded.step,
    )


@dataclass(frozen=True)
class Rescale:
    """The replicas but the first started during the measurement, then SIGTERMed (a scale 1 → N → 1)."""

    up_at: float
    """Seconds after the runs were created that the other replicas were started."""
    down_at: float
    """Seconds after the runs were created that they were sent SIGTERM."""
    joined: float | None = None
    """Seconds from their start until every Lease of the group showed the view of all N applied."""
    left: float | None = None
    """Seconds from the SIGTERM until the last of them exited (its runs handed over)."""
    regrouped: float | None = None
    """Seconds from the SIGTERM until the first replica's Lease alone showed its own view applied."""


@dataclass(frozen=True)
class Kill:
    """One replica SIGKILLed during the measurement."""

    replica: str
    at: float
    """``time.time()`` of the SIGKILL."""
    members: tuple[str, ...]
    """The live members just before it: the view under which the killed replica owned its runs."""
    regrouped: float | None = None
    """Seconds from the kill until every survivor's Lease showed the view without the killed replica
    applied (None: not seen before the measurement ended)."""


@dataclass(frozen=True)
class Observed:
    """Everything one repeat recorded, before any figure is computed."""

    replicas: tuple[str, ...]
    runs: int
    objects: Sequence[Mapping[str, Any]]
    """The AgentRuns when the measurement ended."""
    requests: Sequence[OperatorRequest]
    """Every operator request from the first creation on."""
    model_requests: Sequence[ModelRequest]
    created: Mapping[str, float]
    finished_at: Mapping[str, float]
    finished_by: Mapping[str, str]
    """Run → the replica whose status patch turned it terminal."""
    started: float
    wall: float
    cpu: Mapping[str, float]
    """Replica → CPU seconds from the first creation to the end (a killed replica: to its kill)."""
    peak_rss: Mapping[str, int]
    bench_cpu: float
    """Cores the bench process (emulator or proxy, fake Messages API) used on average."""
    latency: float
    settle_seconds: float | None
    fences: int
    stored: Mapping[str, tuple[int, int]]
    load: tuple[float, float]
    kill: Kill | None = None
    rescale: Rescale | None = None
    quota_peak: QuotaPeak | None = None


@dataclass(frozen=True)
class QuotaPeak:
    """The quota object at its largest while the runs went on (sampled once a second)."""

    size: int
    """Its JSON bytes."""
    admitted: int
    """Runs its status listed as admitted in that version."""
    reservations: int
    """Reservations in flight it listed in that version."""

    def bigger(self, other: QuotaPeak | None) -> QuotaPeak:
        return self if other is None or self.size >= other.size else other


@dataclass(frozen=True)
class ReplicaFigures:
    name: str
    runs: int
    iterations: int
    cpu_seconds: float
    writes: int
    conflicts: int
    peak_rss_mib: float
    wall: float

    @property
    def cpu_ms_per_iteration(self) -> float:
        return self.cpu_seconds / self.iterations * 1000 if self.iterations else math.nan

    @property
    def writes_per_iteration(self) -> float:
        return self.writes / self.iterations if self.iterations else math.nan

    @property
    def cores(self) -> float:
        return self.cpu_seconds / self.wall


@dataclass(frozen=True)
class Repeats:
    """Model requests sent again for an iteration a run had already asked for."""

    in_flight: int
    """The earlier request was the last its run had sent: its answer may never have been recorded (a
    replica killed or fenced while waiting for it), so sending it again is the expected resumption."""
    checkpointed: int
    """The run had already gone on to the next iteration before the repeat: the loop writes an
    iteration's transcript chunk before the next request, so that iteration was checkpointed and must
    never be asked again."""

    @property
    def total(self) -> int:
        return self.in_flight + self.checkpointed


@dataclass(frozen=True)
class Failover:
    """What happened to the runs of a SIGKILLed replica."""

    killed: str
    moved: int
    """Runs the killed replica owned (under the view before the kill) and had not finished."""
    resume_delays: list[float]
    """Per moved run that resumed: kill → its first model request (or its terminal status, when it needed
    no more requests) from another replica."""
    moved_finished: int
    regrouped: float | None
    """Kill → every survivor applied the view without the killed replica: the membership's share of the
    failover; the rest of each resumption is the new owner starting the run."""


@dataclass(frozen=True)
class ReplicaRun:
    replicas: int
    runs: int
    makespan: float
    """First creation → last terminal status write (or → giving up, when runs were left unfinished)."""
    finished: int
    unfinished: dict[str, int]
    """Phase → runs not finished when the benchmark gave up."""
    fences: int
    """Times a replica fenced itself (its Lease renewal came too late), from the operator logs."""
    first_request_latencies: list[float]
    iterations: int
    cpu_seconds: float
    writes: int
    succeeded: int
    written_by_two: int
    """Runs whose AgentRun more than one replica wrote (expected for a run a failover moved)."""
    concurrent: int
    """Runs two replicas executed at the same time (model requests of both in flight together)."""
    repeats: Repeats
    settle_seconds: float | None
    bench_cpu: float
    per_replica: list[ReplicaFigures]
    breakdown: dict[str, float]
    """Operator writes per iteration, by kind, all replicas."""
    conflicts: int
    """Operator requests answered 409 Conflict (a read-modify-write lost a race: Leases, quota ledgers)."""
    stored: dict[str, tuple[int, int]]
    """Resource → (objects, JSON bytes) in the namespace after the runs finished."""
    load: tuple[float, float]
    failover: Failover | None
    rescale: Rescale | None = None
    quota_peak: QuotaPeak | None = None

    @property
    def cpu_ms_per_iteration(self) -> float:
        return self.cpu_seconds / max(self.iterations, 1) * 1000

    @property
    def writes_per_iteration(self) -> float:
        return self.writes / max(self.iterations, 1)


def repeats(requests: Iterable[ModelRequest]) -> Repeats:
    """Repeated model requests of every run, split by whether the repeated iteration was checkpointed."""
    in_flight = checkpointed = 0
    for run_requests in _by_run(requests).values():
        asked: set[int] = set()
        for request in run_requests:
            if request.step in asked:
                if any(step > request.step for step in asked):
                    checkpointed += 1
                else:
                    in_flight += 1
            asked.add(request.step)
    return Repeats(in_flight, checkpointed)


def concurrent_runs(requests: Iterable[ModelRequest], latency: float, kill: Kill | None = None) -> int:
    """Runs two replicas executed at once: their spans of model requests overlap.

    A replica's span of a run is its first request to its last request's answer (arrival + model
    latency, a lower bound: the answer may come later), cut at its kill. A run handed over cleanly has
    disjoint spans: the old owner has stopped before the new one sends anything.
    """
    count = 0
    for run_requests in _by_run(requests).values():
        spans: dict[str, list[float]] = {}
        for request in run_requests:
            end = request.at + latency
            if kill is not None and request.replica == kill.replica:
                end = min(end, kill.at)
            span = spans.setdefault(request.replica, [request.at, end])
            span[1] = max(span[1], end)
        if any(a[0] < b[1] and b[0] < a[1] for a, b in itertools.combinations(spans.values(), 2)):
            count += 1
    return count


def failover(
    kill: Kill,
    uids: Mapping[str, str],
    requests: Iterable[ModelRequest],
    finished_at: Mapping[str, float],
    finished_by: Mapping[str, str],
) -> Failover:
    """The killed replica's unfinished runs (rendezvous owner under the view before the kill, as the
    replicas compute it) and how long each took to resume on another replica."""
    moved = [
        run
        for run, uid in uids.items()
        if owner(uid, kill.members) == kill.replica and finished_at.get(run, math.inf) > kill.at
    ]
    by_run = _by_run(requests)
    delays = []
    for run in moved:
        resumed = [r.at for r in by_run.get(run, []) if r.at > kill.at and r.replica != kill.replica]
        if run in finished_at and finished_by.get(run) != kill.replica:
            resumed.append(finished_at[run])
        if resumed:
            delays.append(min(resumed) - kill.at)
    return Failover(
        killed=kill.replica,
        moved=len(moved),
        resume_delays=delays,
        moved_finished=sum(1 for run in moved if run in finished_at),
        regrouped=kill.regrouped,
    )


def figures(observed: Observed) -> ReplicaRun:
    """One repeat's figures; requests after the last terminal status write are left out (the replicas
    idle after it), and so is everything when runs were left unfinished past the benchmark's patience."""
    o = observed
    unfinished = collections.Counter(
        str((obj.get("status") or {}).get("phase"))
        for obj in o.objects
        if obj["metadata"]["name"] not in o.finished_at
    )
    end = max(o.finished_at.values(), default=o.started) if not unfinished else o.started + o.wall
    window = [r for r in o.requests if r.at <= end]
    iterations_of = {
        obj["metadata"]["name"]: int((obj.get("status") or {}).get("iterations") or 0) for obj in o.objects
    }
    writes = collections.Counter(r.replica for r in window if r.is_write)
    conflicts = collections.Counter(r.replica for r in window if r.status == 409)
    writers: dict[str, set[str]] = collections.defaultdict(set)
    for r in window:
        if r.is_write and r.run is not None:
            writers[r.run].add(r.replica)
    iterations = sum(iterations_of.values())
    per_replica = [
        ReplicaFigures(
            name=name,
            runs=sum(1 for who in o.finished_by.values() if who == name),
            iterations=sum(iterations_of.get(run, 0) for run, who in o.finished_by.items() if who == name),
            cpu_seconds=o.cpu[name],
            writes=writes[name],
            conflicts=conflicts[name],
            peak_rss_mib=o.peak_rss[name] / 2**20,
            wall=o.wall,
        )
        for name in o.replicas
    ]
    kinds = collections.Counter(r.kind for r in window if r.is_write)
    first = {run: rs[0].at for run, rs in _by_run(o.model_requests).items()}
    uids = {obj["metadata"]["name"]: str(obj["metadata"].get("uid")) for obj in o.objects}
    return ReplicaRun(
        replicas=len(o.replicas),
        runs=o.runs,
        makespan=end - o.started,
        finished=len(o.finished_at),
        unfinished=dict(unfinished),
        fences=o.fences,
        first_request_latencies=[first[n] - o.created[n] for n in o.created if n in first],
        iterations=iterations,
        cpu_seconds=sum(o.cpu.values()),
        writes=sum(writes.values()),
        succeeded=sum(1 for obj in o.objects if (obj.get("status") or {}).get("phase") == "Succeeded"),
        written_by_two=sum(1 for who in writers.values() if len(who) > 1),
        concurrent=concurrent_runs(o.model_requests, o.latency, o.kill),
        repeats=repeats(o.model_requests),
        settle_seconds=o.settle_seconds,
        bench_cpu=o.bench_cpu,
        per_replica=per_replica,
        breakdown={kind: count / max(iterations, 1) for kind, count in kinds.most_common()},
        conflicts=sum(conflicts.values()),
        stored=dict(o.stored),
        quota_peak=o.quota_peak,
        load=o.load,
        failover=(
            None if o.kill is None else failover(o.kill, uids, o.model_requests, o.finished_at, o.finished_by)
        ),
        rescale=o.rescale,
    )


def _by_run(requests: Iterable[ModelRequest]) -> dict[str, list[ModelRequest]]:
    """Each run's model requests in arrival order."""
    runs: dict[str, list[ModelRequest]] = collections.defaultdict(list)
    for request in sorted(requests, key=lambda r: r.at):
        runs[request.run].append(request)
    return runs
