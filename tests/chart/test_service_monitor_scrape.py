"""The chart's ServiceMonitor, scraped by a real Prometheus the way the Prometheus Operator configures it.

The operator's metrics label runs by their own `namespace`; the Prometheus Operator gives every
ServiceMonitor target a `namespace` label too (the operator's). Which one a stored series keeps is
decided by Prometheus at scrape time (honor_labels), so this is checked on what Prometheus stores:
the operator's metrics server serves a registry with runs finished in two namespaces, Prometheus
scrapes it through the job generated from the rendered ServiceMonitor, and the queries the alerts and
the dashboard make per namespace must name the runs' namespaces.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from prometheus_client import CollectorRegistry

from agentrun.api.stops import Outcome, StopReason
from agentrun.api.traces import Progress
from agentrun.api.usage import TokenUsage
from agentrun.loop.events import RunFinished, RunStarted
from agentrun.metrics.definitions import Metrics
from agentrun.metrics.observing import MetricsObserver
from agentrun.metrics.serving import start_metrics_server
from tests.chart.tooling import MONITORING_API, NAMESPACE, Renderer, one
from tests.support.kube_requests import until
from tests.support.ports import free_port
from tests.support.prometheus import Endpoint, running_prometheus, service_monitor_job

#: Runs finished per namespace, and how: team-a's mostly loop, team-b's succeed.
RUNS = {
    "team-a": [StopReason.LOOP_DETECTED] * 4 + [StopReason.END_TURN],
    "team-b": [StopReason.END_TURN] * 3,
}


async def _finish_runs(metrics: Metrics) -> None:
    for namespace, reasons in RUNS.items():
        for reason in reasons:
            observer = MetricsObserver(metrics, namespace=namespace, started_monotonic=0.0)
            progress = Progress(2, 0, TokenUsage(), Decimal("0.01"))
            await observer.notify(RunStarted(resumed=False, progress=Progress(0, 0, TokenUsage(), None)))
            await observer.notify(RunFinished(Outcome(reason, "done"), progress))


async def test_prometheus_stores_each_runs_namespace_not_the_operators_from_the_service_monitor(
    renderer: Renderer, tmp_path: Path
) -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True, "interval": "1s", "scrapeTimeout": "1s"}}}
    manifests = renderer.render(values, api_versions=[MONITORING_API])
    monitor, service = one(manifests, "ServiceMonitor"), one(manifests, "Service")
    container = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["name"]

    metrics = Metrics(CollectorRegistry())
    await _finish_runs(metrics)
    port = free_port()
    server = await start_metrics_server(metrics.registry, "127.0.0.1", port)
    endpoint = Endpoint(f"127.0.0.1:{port}", "agentrun-operator-7c9d-x2k4q", container, "http-metrics")
    job = service_monitor_job(monitor, service, endpoint)
    try:
        async with running_prometheus(tmp_path / "prometheus", [job]) as prometheus:
            finished_by_namespace = "sum by (namespace) (agentrun_runs_finished_total)"

            async def scraped() -> bool:
                return bool(await prometheus.query(finished_by_namespace))

            await until(scraped, "Prometheus to store a scrape of the operator", timeout=30)
            assert await prometheus.by_label(finished_by_namespace, "namespace") == {
                namespace: len(reasons) for namespace, reasons in RUNS.items()
            }, f"the operator's namespace {NAMESPACE!r} replaced the runs' own"
            # What AgentRunHighLoopRate divides, per namespace: team-b's successes do not dilute team-a's
            # (team-b has no loop series at all).
            loop_share = (
                'sum by (namespace) (agentrun_runs_finished_total{stop_reason=~"MaxIterations|LoopDetected"})'
                " / sum by (namespace) (agentrun_runs_finished_total)"
            )
            assert await prometheus.by_label(loop_share, "namespace") == {"team-a": 0.8}
            # The dashboard's per-namespace cost legend.
            assert await prometheus.by_label("sum by (namespace) (agentrun_cost_usd_total)", "namespace") == {
                "team-a": 0.05,
                "team-b": 0.03,
            }
            assert not await prometheus.query("agentrun_runs_finished_total{exported_namespace!=''}")
            # Series without a namespace of their own keep the target's, and the job the alerts match on.
            [active] = await prometheus.query("agentrun_runs_active")
            assert active["metric"]["namespace"] == NAMESPACE
            assert active["metric"]["job"] == "agentrun-operator"
            assert active["metric"]["pod"] == endpoint.pod
            assert await prometheus.query('up{job=~".*agentrun.*"} == 1')
    finally:
        await server.cleanup()
