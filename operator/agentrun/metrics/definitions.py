"""The operator's metrics: every definition, on an injected registry, and the methods that change them.

What feeds them: the per-run observer of loop events (metrics/observing.py), and the controller, which
calls the methods here and never touches a Prometheus object itself. No per-run labels: a label per
run would grow the series count without bound. Namespace, model, tool and stop-reason labels are
bounded by the cluster's own size and by our own enums. Units are base units (seconds, USD, tokens) and
counters end in `_total` (prometheus_client adds it).
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable
from importlib import metadata
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics import MetricWrapperBase

from agentrun import __version__
from agentrun.api.stops import StopReason
from agentrun.metrics.quota_metrics import QuotaMetrics

ITERATION_BUCKETS = (1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 130, 200)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
DECISIONS = ("approved", "denied", "timed_out")
RUN_DURATION_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


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


Metric = TypeVar("Metric", bound=MetricWrapperBase)


class Metrics(QuotaMetrics):
    """Every metric of the operator, registered on an injected registry (tests use their own)."""

    def __init__(self, registry: CollectorRegistry, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.registry = registry
        self._wall_clock = wall_clock
        self._running_since: dict[str, float] = {}
        self._series: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}
        self._init_run_metrics(registry)
        self._init_model_metrics(registry)
        self._init_tool_metrics(registry)
        self._init_quota_metrics(registry)
        self._init_replica_metrics(registry)
        self._init_child_metrics(registry)
        self._init_schedule_metrics(registry)
        self._init_process_metrics(registry)

    def series(self, metric: Metric, *labels: str) -> Metric:
        """``metric.labels(*labels)``, looked up once: the per-iteration metrics are read several times in
        every iteration of every run, and prometheus_client converts, checks and locks on each lookup
        (issue #32). Only for metrics whose series are never removed (a removed one would be kept here)."""
        key = (id(metric), labels)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = metric.labels(*labels)
        return found  # type: ignore[return-value]

    # Runs ------------------------------------------------------------------------------------------

    def _init_run_metrics(self, registry: CollectorRegistry) -> None:
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

    def run_began(self, uid: str, started_at: float | None = None) -> None:
        """A run executes here now: counted in agentrun_runs_active, and tracked for the oldest-run gauge
        from ``started_at`` (its status.startTime, Unix seconds; None: now) by uid, never a label."""
        self.runs_active.inc()
        self._running_since[uid] = self._wall_clock() if started_at is None else started_at

    def run_ended(self, uid: str) -> None:
        """The run no longer executes here (finished, stopped, handed over)."""
        self._running_since.pop(uid, None)
        self.runs_active.dec()

    def run_finished(self, namespace: str, stop_reason: StopReason) -> None:
        """The one place a finished run is counted: the loop's end (metrics/observing.py) and a run that
        ends before its loop (the reconciler's finish phase) both come here."""
        self.runs_finished.labels(namespace, stop_reason.value, outcome_of(stop_reason.succeeded)).inc()

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

    # Model requests and tokens ---------------------------------------------------------------------

    def _init_model_metrics(self, registry: CollectorRegistry) -> None:
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

    # Tools and approvals ---------------------------------------------------------------------------

    def _init_tool_metrics(self, registry: CollectorRegistry) -> None:
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
        self.sandbox_start = Histogram(
            "agentrun_sandbox_start_seconds",
            "From creating a run's sandbox pod to its container running (image pull included).",
            ["namespace"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.sandbox_pods = Counter(
            "agentrun_sandbox_pods_started",
            "Sandbox pods started, by why: first (the run's first command), replaced (one was lost) or "
            "idle (the first command after one was deleted for idleness).",
            ["namespace", "reason"],
            registry=registry,
        )
        self.sandbox_idle_deletions = Counter(
            "agentrun_sandbox_pods_idle_deleted",
            "Sandbox pods deleted after spec.sandbox.idleTimeoutSeconds without a sandbox call.",
            ["namespace"],
            registry=registry,
        )

    def sandbox_started(self, namespace: str, seconds: float, *, reason: str) -> None:
        self.sandbox_start.labels(namespace).observe(seconds)
        self.sandbox_pods.labels(namespace, reason).inc()

    def sandbox_idle_deleted(self, namespace: str) -> None:
        self.sandbox_idle_deletions.labels(namespace).inc()

    # The process -----------------------------------------------------------------------------------

    def _init_process_metrics(self, registry: CollectorRegistry) -> None:
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
