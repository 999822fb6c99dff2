"""Metric definitions and the observer that feeds them from loop events.

No per-run labels: a label per run would grow the series count without bound. Namespace, model,
tool and stop-reason labels are bounded by the cluster's own size and by our own enums. The `tool`
label is a name the run declares (its RunStarted event lists them) or UNDECLARED_TOOL: a model may
call any name it invents, and each would otherwise become series of its own. Units are base units
(seconds, USD, tokens) and counters end in `_total` (prometheus_client adds it).
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from importlib import metadata
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from agentrun import __version__
from agentrun.api.traces import Progress
from agentrun.loop.events import (
    ApprovalDecided,
    ApprovalRequested,
    Checkpoint,
    ContextCompacted,
    Event,
    LoopDetected,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallRecovered,
    UsageAdopted,
)

ITERATION_BUCKETS = (1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 130, 200)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
DECISIONS = ("approved", "denied", "timed_out")
RUN_DURATION_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


#: The `tool` label of every call (and loop) of a name the run does not declare. Tool names are
#: `[a-zA-Z0-9_-]{1,64}`, so no declared tool can be called this.
UNDECLARED_TOOL = "(undeclared)"

QUOTA_RESOURCES = ("concurrentRuns", "runs", "tokens", "costUSD")
RESERVED_RESOURCES = ("tokens", "costUSD")
QUOTA_STAGES = ("admission", "request", "spec")


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _amount(value: object) -> float | None:
    """A count or a decimal string ("0.123456", as the ledger writes dollars); None if it is neither."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float | Decimal):
        return float(value)
    if isinstance(value, str):
        try:
            amount = Decimal(value.strip())
        except ArithmeticError:
            return None
        return float(amount) if amount.is_finite() else None
    return None


def _limits_from_summary(summary: object) -> dict[str, str]:
    """{"runs": "100"} from {"runs": "10/100"}; an entry without "/" has no limit."""
    return {
        resource: cell.partition("/")[2]
        for resource, cell in _mapping(summary).items()
        if isinstance(cell, str) and "/" in cell
    }


class Monotonic(Protocol):
    def monotonic(self) -> float: ...


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def build_labels() -> dict[str, str]:
    """Versions that matter when comparing two operators' behaviour (SDK retries, Kopf watches)."""
    return {
        "version": __version__,
        "python": platform.python_version(),
        "kopf": _version("kopf"),
        "anthropic": _version("anthropic"),
    }


def outcome_of(succeeded: bool) -> str:
    return "succeeded" if succeeded else "failed"


class Metrics:
    """Every metric of the operator, registered on an injected registry (tests use their own)."""

    def __init__(self, registry: CollectorRegistry, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.registry = registry
        self._wall_clock = wall_clock
        self._running_since: dict[str, float] = {}
        self.runs_started = Counter(
            "agentrun_runs_started",
            "Runs whose loop started (resumed runs count again, with resumed=true).",
            ["namespace", "resumed"],
            registry=registry,
        )
        self.runs_finished = Counter(
            "agentrun_runs_finished",
            "Runs that reached a terminal state, by stop reason and outcome (succeeded or failed).",
            ["namespace", "stop_reason", "outcome"],
            registry=registry,
        )
        self.runs_active = Gauge("agentrun_runs_active", "Runs executing now.", registry=registry)
        self.runs_queued = Gauge(
            "agentrun_runs_queued", "Runs waiting for a slot (maxConcurrentRuns).", registry=registry
        )
        self.runs_queued_by_namespace = Gauge(
            "agentrun_runs_queued_by_namespace",
            "Runs waiting for a slot (maxConcurrentRuns), per namespace: the fair queue serves them in turn.",
            ["namespace"],
            registry=registry,
        )
        self.oldest_run_age = Gauge(
            "agentrun_oldest_running_run_age_seconds",
            "Age of the oldest executing run since its status.startTime; 0 when none runs.",
            registry=registry,
        )
        self.oldest_run_age.set_function(self._oldest_run_age)
        self.iterations = Histogram(
            "agentrun_run_iterations",
            "Model requests per finished run.",
            ["namespace"],
            buckets=ITERATION_BUCKETS,
            registry=registry,
        )
        self.run_duration = Histogram(
            "agentrun_run_duration_seconds",
            "Wall time of finished runs in this operator process.",
            ["namespace"],
            buckets=RUN_DURATION_BUCKETS,
            registry=registry,
        )
        self.model_requests = Counter(
            "agentrun_model_requests",
            "Model requests by outcome: ok, error (not retried) or the retry class of a retried failure.",
            ["model", "outcome"],
            registry=registry,
        )
        self.model_retries = Counter(
            "agentrun_model_retries",
            "Retries of model requests by retry class.",
            ["retry_class"],
            registry=registry,
        )
        self.model_duration = Histogram(
            "agentrun_model_request_duration_seconds",
            "Duration of model requests (each attempt).",
            ["model"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "agentrun_tokens",
            "Tokens by type (input, output, cache_read, cache_write).",
            ["namespace", "model", "type"],
            registry=registry,
        )
        # A pair for the cache hit ratio (cached / prompt), so the ratio needs no list of token types.
        self.prompt_tokens = Counter(
            "agentrun_prompt_tokens",
            "Input-side tokens of model requests: uncached input, cache reads and cache writes together.",
            ["namespace", "model"],
            registry=registry,
        )
        self.prompt_cached_tokens = Counter(
            "agentrun_prompt_cached_tokens",
            "Input-side tokens read from the prompt cache; divided by agentrun_prompt_tokens_total, "
            "the cache hit ratio.",
            ["namespace", "model"],
            registry=registry,
        )
        self.cost = Counter(
            "agentrun_cost_usd",
            "Spend in US dollars by the operator's price table, counted as each response is priced.",
            ["namespace"],
            registry=registry,
        )
        self.tool_calls = Counter(
            "agentrun_tool_calls",
            "Tool calls by tool and outcome (ok or the error code).",
            ["tool", "outcome"],
            registry=registry,
        )
        self.tool_duration = Histogram(
            "agentrun_tool_call_duration_seconds",
            "Duration of tool calls.",
            ["tool"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.compactions = Counter(
            "agentrun_context_compactions",
            "Compactions of runs' conversations (the summary requests are in the model metrics).",
            registry=registry,
        )
        self.compaction_tokens_removed = Counter(
            "agentrun_context_compaction_tokens_removed",
            "Estimated input tokens compactions removed from the next request.",
            registry=registry,
        )
        self.loop_detections = Counter(
            "agentrun_loop_detections", "Runs stopped by loop detection.", ["tool"], registry=registry
        )
        self.recovered_calls = Counter(
            "agentrun_tool_calls_recovered_from_text",
            "Tool calls written as text and recovered.",
            ["tool"],
            registry=registry,
        )
        self.approvals_pending = Gauge(
            "agentrun_approvals_pending",
            "Tool calls waiting for a human approval decision.",
            registry=registry,
        )
        self.approvals_decided = Counter(
            "agentrun_approvals_decided",
            "Approval decisions by decision (approved, denied or timed_out).",
            ["decision"],
            registry=registry,
        )
        for decision in DECISIONS:
            self.approvals_decided.labels(decision)
        self._init_quota_metrics(registry)
        self._init_replica_metrics(registry)
        self._init_child_metrics(registry)
        self._init_schedule_metrics(registry)
        self.heartbeat = Gauge(
            "agentrun_operator_heartbeat_timestamp_seconds",
            "Unix time of the operator's last heartbeat; stale when its event loop is stuck.",
            registry=registry,
        )
        self.build_info = Gauge(
            "agentrun_build_info",
            "Always 1; the labels name the operator, Python, Kopf and anthropic SDK versions.",
            ["version", "python", "kopf", "anthropic"],
            registry=registry,
        )
        self.build_info.labels(**build_labels()).set(1)
        self.beat()
        ProcessCollector(registry=registry)

    def beat(self) -> None:
        self.heartbeat.set(self._wall_clock())

    def run_began(self, uid: str, started_at: float | None = None) -> None:
        """Track an executing run for the oldest-run gauge (by uid, which never becomes a label)."""
        self._running_since[uid] = self._wall_clock() if started_at is None else started_at

    def run_ended(self, uid: str) -> None:
        self._running_since.pop(uid, None)

    def queue_entered(self, namespace: str) -> None:
        self.runs_queued.inc()
        self.runs_queued_by_namespace.labels(namespace).inc()

    def queue_left(self, namespace: str) -> None:
        self.runs_queued.dec()
        self.runs_queued_by_namespace.labels(namespace).dec()

    def _oldest_run_age(self) -> float:
        if not self._running_since:
            return 0.0
        return max(0.0, self._wall_clock() - min(self._running_since.values()))

    # Quotas ----------------------------------------------------------------------------------------

    def _init_quota_metrics(self, registry: CollectorRegistry) -> None:
        """Gauges mirror each AgentRunQuota's status, so any replica's scrape shows the shared ledger."""
        labels = ["namespace", "quota", "resource"]
        self.quota_hard = Gauge(
            "agentrun_quota_hard",
            "Hard limit of an AgentRunQuota (costUSD in US dollars); no series for an unlimited resource.",
            labels,
            registry=registry,
        )
        self.quota_used = Gauge(
            "agentrun_quota_used",
            "Usage an AgentRunQuota counts: concurrentRuns now, runs/tokens/costUSD in its window.",
            labels,
            registry=registry,
        )
        self.quota_reserved = Gauge(
            "agentrun_quota_reserved",
            "Tokens and US dollars reserved by model requests in flight, not settled yet.",
            labels,
            registry=registry,
        )
        self.quota_lost = Gauge(
            "agentrun_quota_lost_reservations",
            "Reservations charged in full because the operator holding them stopped before the answer "
            "was recorded (status.lost.requests).",
            ["namespace", "quota"],
            registry=registry,
        )
        self.quota_refusals = Counter(
            "agentrun_quota_refusals",
            "Refusals by an AgentRunQuota: stage admission (a run held back), request (a model request "
            "not sent) or spec (a run declaring more than a per-run maximum).",
            ["namespace", "quota", "resource", "stage"],
            registry=registry,
        )
        self._quota_refusal_labels: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def observe_quota(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any] | None,
        *,
        hard: Mapping[str, Any] | None = None,
    ) -> None:
        """Sets the quota's gauges from its status; ``hard`` is its spec.hard.

        Without ``hard`` the limits are read back from status.summary ("used/hard"), which the ledger
        writes with every status. A limit removed from the spec loses its series, so a dashboard never
        compares usage with a limit that no longer exists.
        """
        status = status or {}
        limits = hard if hard is not None else _limits_from_summary(status.get("summary"))
        used = _mapping(status.get("used"))
        reserved = _mapping(status.get("reserved"))
        for resource in QUOTA_RESOURCES:
            limit = _amount(limits.get(resource))
            if limit is None:
                self.quota_hard.remove(namespace, name, resource)
            else:
                self.quota_hard.labels(namespace, name, resource).set(limit)
                # Present from 0 on, so rate() and increase() count the first refusal too.
                for stage in ("admission", "request") if resource in RESERVED_RESOURCES else ("admission",):
                    self._refusals(namespace, name, resource, stage)
            self.quota_used.labels(namespace, name, resource).set(_amount(used.get(resource)) or 0.0)
        for resource in RESERVED_RESOURCES:
            self.quota_reserved.labels(namespace, name, resource).set(_amount(reserved.get(resource)) or 0.0)
        lost = _amount(_mapping(status.get("lost")).get("requests")) or 0.0
        self.quota_lost.labels(namespace, name).set(lost)

    def forget_quota(self, namespace: str, name: str) -> None:
        """A deleted quota's series go with it (they would otherwise show its last usage forever)."""
        for resource in QUOTA_RESOURCES:
            self.quota_hard.remove(namespace, name, resource)
            self.quota_used.remove(namespace, name, resource)
        for resource in RESERVED_RESOURCES:
            self.quota_reserved.remove(namespace, name, resource)
        self.quota_lost.remove(namespace, name)
        for resource, stage in self._quota_refusal_labels.pop((namespace, name), set()):
            self.quota_refusals.remove(namespace, name, resource, stage)

    def quota_refused(self, namespace: str, quota: str, resource: str, stage: str) -> None:
        """``resource`` is the limit that refused (for stage spec, the per-run field, e.g. tokenBudget)."""
        if stage not in QUOTA_STAGES:  # a typo would silently start a series no dashboard queries
            raise ValueError(f"quota refusal stage must be one of {', '.join(QUOTA_STAGES)}, not {stage!r}")
        self._refusals(namespace, quota, resource, stage).inc()

    def _refusals(self, namespace: str, quota: str, resource: str, stage: str) -> Counter:
        self._quota_refusal_labels.setdefault((namespace, quota), set()).add((resource, stage))
        return self.quota_refusals.labels(namespace, quota, resource, stage)

    # Replicas --------------------------------------------------------------------------------------

    def _init_replica_metrics(self, registry: CollectorRegistry) -> None:
        """Labelled by replica so a dashboard summing over pods still tells the replicas apart."""
        self.replica_members = Gauge(
            "agentrun_replica_members",
            "Live members of this replica's group, as this replica sees them (its Lease list).",
            ["replica"],
            registry=registry,
        )
        self.replica_runs_owned = Gauge(
            "agentrun_replica_runs_owned",
            "Unfinished runs this replica owns under its current view.",
            ["replica"],
            registry=registry,
        )
        self.replica_handoffs = Counter(
            "agentrun_replica_handoffs",
            "Runs handed to this replica (in) or away from it (out) by a change of the live members.",
            ["replica", "direction"],
            registry=registry,
        )
        self.replica_fenced = Gauge(
            "agentrun_replica_fenced",
            "1 while this replica could not renew its Lease in time and runs nothing; else 0.",
            ["replica"],
            registry=registry,
        )
        self.replica_loop_lag = Gauge(
            "agentrun_replica_event_loop_lag_seconds",
            "How late the operator's event loop ran its last one-second beat, or for how long it has "
            "not run it (past AGENTRUN_LOOP_STALL_SECONDS the replica stops renewing its Lease).",
            ["replica"],
            registry=registry,
        )

    # Child runs ------------------------------------------------------------------------------------

    def _init_child_metrics(self, registry: CollectorRegistry) -> None:
        self.child_runs_created = Counter(
            "agentrun_child_runs_created",
            "Child AgentRuns agent tools created (a call finding its child after a restart is not counted).",
            ["namespace", "agent"],
            registry=registry,
        )
        self.child_runs_active = Gauge(
            "agentrun_child_runs_active",
            "Child AgentRuns agent tools of this replica are waiting for.",
            ["namespace"],
            registry=registry,
        )
        self.runs_started_by_depth = Counter(
            "agentrun_runs_started_by_depth",
            "Runs whose loop started, by depth in their tree (0: a run nobody started; 1: a child; ...).",
            ["namespace", "depth"],
            registry=registry,
        )

    def replica_seen(self, replica: str, members: int, *, fenced: bool) -> None:
        """What the membership sees after each look at its group's Leases."""
        self.replica_members.labels(replica).set(members)
        self.replica_fenced.labels(replica).set(1 if fenced else 0)

    def child_created(self, namespace: str, agent: str) -> None:
        self.child_runs_created.labels(namespace, agent).inc()

    def child_waiting(self, namespace: str, delta: int) -> None:
        """+1 when an agent tool starts waiting for its child, -1 when it stops."""
        self.child_runs_active.labels(namespace).inc(delta)

    def run_started_at_depth(self, namespace: str, depth: int) -> None:
        self.runs_started_by_depth.labels(namespace, str(depth)).inc()

    def replica_loop_lagged(self, replica: str, seconds: float) -> None:
        self.replica_loop_lag.labels(replica).set(seconds)

    def replica_owns(self, replica: str, runs: int) -> None:
        self.replica_runs_owned.labels(replica).set(runs)

    def replica_handoff(self, replica: str, direction: str, count: int = 1) -> None:
        """``direction``: "in" (a run this replica took over) or "out" (one it gave up)."""
        if direction not in ("in", "out"):
            raise ValueError(f"handoff direction must be 'in' or 'out', not {direction!r}")
        self.replica_handoffs.labels(replica, direction).inc(count)

    # Schedules -------------------------------------------------------------------------------------

    #: What a schedule did with a due time (agentrun_schedule_runs_total{result}).
    SCHEDULE_RESULTS = ("created", "skipped_forbid", "replaced", "missed_deadline", "suspended")

    def _init_schedule_metrics(self, registry: CollectorRegistry) -> None:
        self.schedule_runs = Counter(
            "agentrun_schedule_runs",
            "Due times of AgentSchedules, by what became of them: created, skipped_forbid, replaced "
            "(created after cancelling the active runs), missed_deadline, suspended.",
            ["namespace", "schedule", "result"],
            registry=registry,
        )
        self.schedule_next_run = Gauge(
            "agentrun_schedule_next_run_timestamp_seconds",
            "When the AgentSchedule is next due (Unix seconds), as served by this replica.",
            ["namespace", "schedule"],
            registry=registry,
        )

    def schedule_time_handled(self, namespace: str, schedule: str, result: str) -> None:
        if result not in self.SCHEDULE_RESULTS:
            raise ValueError(f"schedule result must be one of {self.SCHEDULE_RESULTS}, not {result!r}")
        self.schedule_runs.labels(namespace, schedule, result).inc()

    def schedule_next(self, namespace: str, schedule: str, timestamp: float | None) -> None:
        """None: not due (suspended, invalid) or not served here: the series goes away."""
        if timestamp is None:
            with contextlib.suppress(KeyError):
                self.schedule_next_run.remove(namespace, schedule)
        else:
            self.schedule_next_run.labels(namespace, schedule).set(timestamp)


class MetricsObserver:
    """Per-run adapter from loop events to the shared metrics; keeps only what a delta needs."""

    def __init__(
        self, metrics: Metrics, *, namespace: str, started_monotonic: float, clock: Monotonic | None = None
    ) -> None:
        self._m = metrics
        self._namespace = namespace
        self._started = started_monotonic
        self._clock = clock
        self._cost_seen = Decimal(0)
        self._approvals_pending = 0
        self._tools: frozenset[str] = frozenset()

    def _tool(self, name: str) -> str:
        """``name`` if the run declares it, else the one bucket of every invented name."""
        return name if name in self._tools else UNDECLARED_TOOL

    def _count_cost(self, progress: Progress) -> None:
        """Spend is counted per priced response, so a cost-burn alert sees a long run burning."""
        if progress.cost_usd is None:
            return
        delta = progress.cost_usd - self._cost_seen
        if delta > 0:
            self._m.cost.labels(self._namespace).inc(float(delta))
            self._cost_seen = progress.cost_usd

    def approval_requested(self) -> None:
        self._approvals_pending += 1
        self._m.approvals_pending.inc()

    def approval_decided(self) -> None:
        if self._approvals_pending > 0:
            self._approvals_pending -= 1
            self._m.approvals_pending.dec()

    async def notify(self, event: Event) -> None:
        m, ns = self._m, self._namespace
        match event:
            case RunStarted(resumed=resumed, progress=progress, tools=tools):
                self._tools = frozenset(tools)
                m.runs_started.labels(ns, str(resumed).lower()).inc()
                # A resumed run was already counted up to its checkpoint by an earlier process.
                self._cost_seen = progress.cost_usd or Decimal(0)
            case ModelRequestFinished(model=model, duration_seconds=seconds, outcome=outcome, usage=usage):
                m.model_requests.labels(model, outcome).inc()
                m.model_duration.labels(model).observe(seconds)
                for kind, value in (
                    ("input", usage.input_tokens),
                    ("output", usage.output_tokens),
                    ("cache_read", usage.cache_read_input_tokens),
                    ("cache_write", usage.cache_creation_input_tokens),
                ):
                    if value:
                        m.tokens.labels(ns, model, kind).inc(value)
                prompt = (
                    usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
                )
                if prompt:
                    m.prompt_tokens.labels(ns, model).inc(prompt)
                    m.prompt_cached_tokens.labels(ns, model).inc(usage.cache_read_input_tokens)
            case UsageAdopted(cost_usd=adopted):
                # Child runs' spend: their own observers counted it; the parent's cost only carries it.
                self._cost_seen += adopted or Decimal(0)
            case Checkpoint(progress=progress):
                self._count_cost(progress)
            case ModelRetryScheduled(retry_class=retry_class):
                m.model_retries.labels(retry_class).inc()
            case ToolCallFinished(trace=trace):
                tool = self._tool(trace.name)
                m.tool_calls.labels(tool, "ok" if trace.ok else (trace.error_code or "error")).inc()
                m.tool_duration.labels(tool).observe(trace.duration_seconds)
            case ApprovalRequested():
                self.approval_requested()
            case ApprovalDecided(approved=approved, timed_out=timed_out):
                decision = "timed_out" if timed_out else ("approved" if approved else "denied")
                m.approvals_decided.labels(decision).inc()
                self.approval_decided()
            case LoopDetected(tool_name=tool):
                m.loop_detections.labels(self._tool(tool)).inc()
            case ContextCompacted(tokens_before=before, tokens_after=after):
                m.compactions.inc()
                m.compaction_tokens_removed.inc(max(before - after, 0))
            case ToolCallRecovered(tool_name=tool):
                m.recovered_calls.labels(self._tool(tool)).inc()
            case RunFinished(outcome=outcome, progress=progress):
                self._count_cost(progress)
                reason = outcome.stop_reason
                m.runs_finished.labels(ns, reason.value, outcome_of(reason.succeeded)).inc()
                m.iterations.labels(ns).observe(progress.iterations)
                if self._clock is not None:
                    self.finished(self._clock.monotonic())
                self.release_approvals()
            case _:
                pass

    def release_approvals(self) -> None:
        """A run that ends (or stops in this process) no longer waits for anyone."""
        while self._approvals_pending:
            self.approval_decided()

    def finished(self, now_monotonic: float) -> None:
        self._m.run_duration.labels(self._namespace).observe(max(0.0, now_monotonic - self._started))
