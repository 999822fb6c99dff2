"""Metric definitions and the observer that feeds them from loop events.

No per-run labels: a label per run would grow the series count without bound. Namespace and
model labels are bounded by the cluster's own size.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agentrun.loop.events import (
    Event,
    LoopDetected,
    ModelRequestFinished,
    ModelRetryScheduled,
    RunFinished,
    RunStarted,
    ToolCallFinished,
    ToolCallRecovered,
)

ITERATION_BUCKETS = (1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 130, 200)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.runs_started = Counter(
            "agentrun_runs_started",
            "Runs whose loop started (resumed runs count again).",
            ["namespace", "resumed"],
            registry=registry,
        )
        self.runs_finished = Counter(
            "agentrun_runs_finished",
            "Runs that reached a terminal state.",
            ["namespace", "stop_reason", "outcome"],
            registry=registry,
        )
        self.runs_active = Gauge("agentrun_runs_active", "Runs executing now.", registry=registry)
        self.runs_queued = Gauge(
            "agentrun_runs_queued", "Runs waiting for a slot (maxConcurrentRuns).", registry=registry
        )
        self.iterations = Histogram(
            "agentrun_run_iterations",
            "Model requests per finished run.",
            ["namespace"],
            buckets=ITERATION_BUCKETS,
            registry=registry,
        )
        self.run_duration = Histogram(
            "agentrun_run_duration_seconds",
            "Wall time of finished runs (this operator process).",
            ["namespace"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.model_requests = Counter(
            "agentrun_model_requests",
            "Model requests by outcome (ok, error, or the retry class).",
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
            "Duration of model requests.",
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
        self.cost = Counter(
            "agentrun_cost_usd",
            "Spend in US dollars of finished runs, by the price table.",
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
        self.loop_detections = Counter(
            "agentrun_loop_detections", "Runs stopped by loop detection.", ["tool"], registry=registry
        )
        self.recovered_calls = Counter(
            "agentrun_tool_calls_recovered_from_text",
            "Tool calls written as text and recovered.",
            ["tool"],
            registry=registry,
        )


class MetricsObserver:
    """Per-run adapter from loop events to the shared metrics; keeps only what a delta needs."""

    def __init__(self, metrics: Metrics, *, namespace: str, started_monotonic: float) -> None:
        self._m = metrics
        self._namespace = namespace
        self._started = started_monotonic

    async def notify(self, event: Event) -> None:
        m, ns = self._m, self._namespace
        match event:
            case RunStarted(resumed=resumed):
                m.runs_started.labels(ns, str(resumed).lower()).inc()
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
            case ModelRetryScheduled(retry_class=retry_class):
                m.model_retries.labels(retry_class).inc()
            case ToolCallFinished(trace=trace):
                m.tool_calls.labels(trace.name, "ok" if trace.ok else (trace.error_code or "error")).inc()
                m.tool_duration.labels(trace.name).observe(trace.duration_seconds)
            case LoopDetected(tool_name=tool):
                m.loop_detections.labels(tool).inc()
            case ToolCallRecovered(tool_name=tool):
                m.recovered_calls.labels(tool).inc()
            case RunFinished(outcome=outcome, progress=progress):
                reason = outcome.stop_reason
                m.runs_finished.labels(ns, reason.value, "succeeded" if reason.succeeded else "failed").inc()
                m.iterations.labels(ns).observe(progress.iterations)
                if progress.cost_usd is not None:
                    m.cost.labels(ns).inc(float(progress.cost_usd))
            case _:
                pass

    def finished(self, now_monotonic: float) -> None:
        self._m.run_duration.labels(self._namespace).observe(max(0.0, now_monotonic - self._started))
