"""A real Prometheus scraping the chart's operator pods, with the chart's rules and the dashboard's queries.

The chart is installed as in the other node scenarios, the operator serving a second namespace where
the runs are (so a run's `namespace` label differs from the operator's). The ServiceMonitor and the
PrometheusRule are rendered by `helm template` for the same release (the API server does not serve
monitoring.coreos.com), and Debian's Prometheus gets what the Prometheus Operator would give it: the
ServiceMonitor's job, its targets found by Kubernetes service discovery through the metrics Service's
Endpoints, and the PrometheusRule's groups unchanged as a rule file, evaluated every second. A workload
of successes, model errors, loops, limits and tool errors then runs through the fake Messages API, and
what Prometheus stores is checked against what users look at: every dashboard query, every alert and
`kubectl get ar`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import HttpError, Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.chart.tooling import CHART, MONITORING_API, Manifest, one
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster, cluster_for
from tests.support.kube_requests import FINISHED, until
from tests.support.node import HOST_ADDRESS, Helm, Release, create_api_key_secret, release_values
from tests.support.prometheus import EndpointsDiscovery, Prometheus, running_prometheus, service_monitor_job
from tests.support.quotas import create_quota, quota_status
from tests.support.schedules import create_agent, create_schedule, runs_of, schedules_path

API_KEY = "sk-ant-node-prometheus-0123456789"
MODEL = {"name": "claude-haiku-4-5"}
CALC = [{"builtin": {"name": "calculator"}}]
#: The scrape and rule evaluation interval (the ServiceMonitor's, through the chart's values).
SCRAPE_SECONDS = 1
#: Grafana's $__interval for this test's panels: the step of each range query.
STEP_SECONDS = 2
DASHBOARD = CHART / "dashboards" / "agentrun.json"
QUOTA = "team-budget"
#: Room for the whole workload: the quota's gauges and refusal counters are there, it limits nothing.
QUOTA_HARD = {"concurrentRuns": 50, "runs": 500, "tokens": 10_000_000, "costUSD": 100}
AGENT = "researcher"
SCHEDULE = "minutely"

#: Runs of each kind: (count, extra spec, the stopReason each must end with).
WORKLOAD: dict[str, tuple[int, dict[str, Any], str]] = {
    "ok": (4, {}, "EndTurn"),
    "fatal": (6, {}, "ModelError"),
    "loop": (5, {}, "LoopDetected"),
    "maxit": (2, {"limits": {"maxIterations": 2}}, "MaxIterations"),
    "budget": (1, {"limits": {"tokenBudget": 300}}, "TokenBudgetExceeded"),
    "toolerr": (4, {}, "EndTurn"),
    "text": (1, {}, "EndTurn"),
}
#: Bad calculator calls in the one tool turn of each "toolerr" run.
BAD_CALLS = 10

#: The alerts this workload must bring to pending (their `for:` is minutes, so not firing within the test).
EXPECTED_ALERTS = {
    # 7 of about 25 finished runs end in LoopDetected or MaxIterations: over the 20% threshold.
    "AgentRunHighLoopRate",
    # 40 of the calculator's about 70 calls fail: over 50%.
    "AgentRunToolErrorRateHigh",
    # 6 requests answered 400 and 8 rate limited of about 50: over 20%.
    "AgentRunModelErrorRateHigh",
}
#: Dashboard queries (panel title, refId) this workload cannot give data, and the situation each needs.
NEEDS_A_SITUATION = {
    ("Handoffs per replica", "A"): "runs handed between replicas: a replica joining or leaving a group "
    "of two or more while runs are in flight (this release has one replica)",
}


def _scripts() -> list[Script]:
    def calc(expression: str) -> dict[str, Any]:
        return tool_use_block("calculator", {"expression": expression})

    as_text = '<tool_use>{"name": "calculator", "input": {"expression": "2+2"}}</tool_use>'
    return [
        Script(
            "[prom:ok]",
            [
                Reply(
                    [calc("6*7")],
                    usage=ScriptUsage(200, 40, 100, 50),
                    faults=[HttpError.rate_limit(retry_after=0.05, times=2)],
                ),
                Reply([text_block("42.")], usage=ScriptUsage(300, 10, 0, 150)),
            ],
        ),
        Script("[prom:fatal]", [HttpError(status=400, error_type="invalid_request_error", message="bad")]),
        Script("[prom:loop]", [Reply([calc("1+1")], usage=ScriptUsage(100, 20)) for _ in range(4)]),
        Script(
            "[prom:maxit]",
            [Reply([calc("1+1")]), Reply([calc("2+2")]), Reply([text_block("Best so far: 4.")])],
        ),
        Script("[prom:budget]", [Reply([calc("3*3")], usage=ScriptUsage(400, 20)), Reply([text_block("9")])]),
        Script(
            "[prom:toolerr]",
            [
                Reply([calc(f"{i}/0") for i in range(BAD_CALLS)], usage=ScriptUsage(150, 60)),
                Reply([text_block("Cannot divide by zero.")], usage=ScriptUsage(250, 10)),
            ],
        ),
        Script(
            "[prom:text]",
            [Reply([text_block(as_text)], usage=ScriptUsage(80, 20)), Reply([text_block("4.")])],
        ),
        Script(
            "[prom:parent]",
            [
                Reply([tool_use_block("research", {"task": "[prom:child] look it up"})]),
                Reply([text_block("The child found it.")]),
            ],
        ),
        Script("[prom:child]", [Reply([text_block("Found it.")], usage=ScriptUsage(50, 5))]),
        Script("[prom:scheduled]", [Reply([text_block("Checked.")], usage=ScriptUsage(40, 4))]),
    ]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=_scripts(), require_api_key=API_KEY)
    async with api.running(host=HOST_ADDRESS) as server:
        yield server


@pytest.fixture
async def runs(real_kubeconfig: Path | None) -> AsyncIterator[TestCluster]:
    """The namespace the runs are in: another than the operator's."""
    async with cluster_for(real_kubeconfig) as chosen:
        yield chosen


@pytest.fixture
async def release(
    cluster: TestCluster, runs: TestCluster, helm: Helm, model: FakeMessagesAPI
) -> AsyncIterator[Release]:
    """The chart in the operator's namespace serving the runs' namespace, monitored every second."""
    await create_api_key_secret(cluster, API_KEY)
    monitoring = {
        "serviceMonitor": {"enabled": True, "interval": f"{SCRAPE_SECONDS}s", "scrapeTimeout": "1s"},
        "prometheusRule": {"enabled": True},
    }
    values = release_values(cluster, model.url, watchNamespaces=[runs.namespace], metrics=monitoring)
    chosen = Release(cluster, helm, values, name=f"agentrun-operator-{secrets.token_hex(3)}")
    await chosen.install()
    try:
        yield chosen
    finally:
        with contextlib.suppress(AssertionError):
            await chosen.uninstall()


async def monitoring_manifests(release: Release) -> list[Manifest]:
    """What `helm install` would create for this release where the Prometheus Operator's API is served."""
    _, out = await release.helm.run(
        "template",
        release.name,
        str(release.chart),
        "--namespace",
        release.namespace,
        "--values",
        str(release.helm.values_file(release.values)),
        "--api-versions",
        MONITORING_API,
    )
    return [doc for doc in yaml.safe_load_all(out) if doc]


@dataclass
class AlertStates:
    """The most active state each alerting rule reached while watched (inactive < pending < firing)."""

    reached: dict[str, str] = field(default_factory=dict)
    unhealthy: dict[str, str] = field(default_factory=dict)

    async def watch(self, prometheus: Prometheus, stop: asyncio.Event) -> None:
        order = {"inactive": 0, "pending": 1, "firing": 2}
        while not stop.is_set():
            for name, rule in (await prometheus.alerting_rules()).items():
                if name not in self.reached or order[rule["state"]] > order[self.reached[name]]:
                    self.reached[name] = rule["state"]
                if rule.get("health") not in (None, "ok", "unknown"):
                    self.unhealthy[name] = rule.get("lastError", rule["health"])
            await asyncio.sleep(0.5)

    def active(self) -> set[str]:
        return {name for name, state in self.reached.items() if state != "inactive"}


async def run_workload(runs: TestCluster) -> list[str]:
    """Creates the quota, the runs, an Agent-backed parent and a minutely schedule: the run names."""
    await create_quota(runs, QUOTA, hard=QUOTA_HARD)
    names = []
    for kind, (count, spec, _) in WORKLOAD.items():
        for i in range(count):
            name = f"{kind}-{i}"
            await runs.request(
                "POST",
                runs.runs_path,
                json=agentrun(
                    name, f"[prom:{kind}] {name}", namespace=runs.namespace, model=MODEL, tools=CALC, **spec
                ),
            )
            names.append(name)
    await create_agent(runs, AGENT, systemPrompt="You look one thing up.", model=MODEL)
    parent = agentrun("parent", "[prom:parent] delegate", namespace=runs.namespace, model=MODEL)
    parent["spec"]["tools"] = [
        {"agent": {"name": "research", "agentRef": {"name": AGENT}, "description": "Looks one thing up."}}
    ]
    await runs.request("POST", runs.runs_path, json=parent)
    await create_schedule(
        runs,
        SCHEDULE,
        schedule="* * * * *",
        agentRef={"name": AGENT},
        task="[prom:scheduled] {{scheduledTime}}",
    )
    return [*names, "parent"]


async def all_runs(runs: TestCluster) -> list[dict[str, Any]]:
    """`kubectl get ar` in the runs' namespace."""
    code, out = await runs.kubectl("get", "ar", "-n", runs.namespace, "-o", "json")
    assert code == 0, out
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


async def wait_workload_done(runs: TestCluster, names: list[str]) -> list[dict[str, Any]]:
    """Until every run is finished, the schedule has made a run and is then suspended, and its runs ended."""
    found: list[dict[str, Any]] = []

    async def scheduled_once() -> bool:
        return bool(await runs_of(runs, SCHEDULE))

    await until(scheduled_once, "the minutely schedule to create a run", 150)
    await runs.request(
        "PATCH",
        schedules_path(runs, SCHEDULE),
        data=json.dumps({"spec": {"suspend": True}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )

    async def finished() -> bool:
        nonlocal found
        found = await all_runs(runs)
        listed = {r["metadata"]["name"] for r in found}
        return set(names) <= listed and all(r.get("status", {}).get("phase") in FINISHED for r in found)

    await until(finished, f"the {len(names)} runs, the child and the scheduled ones to finish", 180)
    return found


def rate_interval_seconds() -> int:
    """Grafana's $__rate_interval: max($__interval + scrape interval, 4 × scrape interval)."""
    return max(STEP_SECONDS + SCRAPE_SECONDS, 4 * SCRAPE_SECONDS)


def dashboard_queries(start: float, end: float) -> dict[tuple[str, str], str]:
    """Every panel's query keyed by (title, refId), its variables as Grafana substitutes them for this
    range with "All" jobs: $job is the variable's allValue, $__range the range, $__rate_interval
    `rate_interval_seconds`."""
    dashboard = json.loads(DASHBOARD.read_text())
    [job] = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    rate_interval = rate_interval_seconds()
    variables = {
        "$__rate_interval": f"{rate_interval}s",
        "$__range": f"{math.ceil(end - start)}s",
        "$job": job["allValue"],
    }
    queries = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in variables.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"a Grafana variable this test does not substitute: {expr}"
            queries[(panel["title"], target["refId"])] = expr
    return queries


def own_cost(status: dict[str, Any]) -> Decimal:
    """What a run spent itself: status.usage.costUSD less its children's (status.children.costUSD)."""
    total = Decimal((status.get("usage") or {}).get("costUSD") or 0)
    return total - Decimal((status.get("children") or {}).get("costUSD") or 0)


def has_a_value(series: list[dict[str, Any]]) -> bool:
    """What a panel draws: some series with a sample that is a number (NaN is drawn as nothing)."""
    return any(not math.isnan(float(value)) for s in series for _, value in s["values"])


async def assert_counters_agree(
    prometheus: Prometheus, runs: TestCluster, found: list[dict[str, Any]]
) -> None:
    """The finished-run counters equal `kubectl get ar`'s stop reasons, under the runs' namespace; the
    spend and the quota's runs equal the runs' and the quota's status."""
    expected = Counter(r["status"]["stopReason"] for r in found)
    for kind, (count, _, reason) in WORKLOAD.items():
        of_kind = [r for r in found if r["metadata"]["name"].startswith(f"{kind}-")]
        assert Counter(r["status"]["stopReason"] for r in of_kind) == {reason: count}, (
            kind,
            [r["status"] for r in of_kind],
        )
    by_reason = "sum by (stop_reason) (agentrun_runs_finished_total)"

    async def counted() -> bool:
        return await prometheus.by_label(by_reason, "stop_reason") == expected

    with contextlib.suppress(AssertionError):
        await until(counted, "Prometheus to count every finished run", 30)
    assert await prometheus.by_label(by_reason, "stop_reason") == dict(expected)
    assert await prometheus.by_label("sum by (namespace) (agentrun_runs_finished_total)", "namespace") == {
        runs.namespace: len(found)
    }
    # A parent's status.usage includes its children's spend, which the children's own series count.
    status_cost = sum(own_cost(r["status"]) for r in found)
    assert await prometheus.by_label("sum by (namespace) (agentrun_cost_usd_total)", "namespace") == {
        runs.namespace: pytest.approx(float(status_cost), abs=1e-6)
    }
    quota = await quota_status(runs, QUOTA)
    assert await prometheus.by_label(
        f'agentrun_quota_used{{namespace="{runs.namespace}",resource="runs"}}', "quota"
    ) == {QUOTA: quota["used"]["runs"]}


@pytest.mark.timeout(600)
async def test_a_real_prometheus_scrapes_the_pods_and_the_dashboard_alerts_and_counters_show_the_workload(
    cluster: TestCluster, runs: TestCluster, release: Release, tmp_path: Path
) -> None:
    [pod] = await release.wait_ready(1)
    manifests = await monitoring_manifests(release)
    monitor, rule = one(manifests, "ServiceMonitor"), one(manifests, "PrometheusRule")
    service = one(manifests, "Service")
    rules_file = tmp_path / "agentrun.rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    async with (
        EndpointsDiscovery(cluster).serving() as discovery,
        running_prometheus(
            tmp_path / "prometheus",
            [service_monitor_job(monitor, service, discovery)],
            interval=f"{SCRAPE_SECONDS}s",
            rule_files=[rules_file],
        ) as prometheus,
    ):
        # Discovered through the metrics Service's Endpoints: the pod, by its IP, under the job the
        # alerts match on, in the operator's namespace.
        pod_ip = pod["status"]["podIP"]

        async def scraped() -> bool:
            return bool(await prometheus.query("up == 1"))

        await until(scraped, f"Prometheus to scrape the operator pod at {pod_ip}", 60)
        [up] = await prometheus.query("up")
        assert up["metric"] == {
            "__name__": "up",
            "container": "operator",
            "endpoint": "http-metrics",
            "instance": f"{pod_ip}:8080",
            "job": "agentrun-operator",
            "namespace": cluster.namespace,
            "pod": pod["metadata"]["name"],
            "service": f"{release.name}-metrics",
        }, prometheus.logs()
        await asyncio.sleep(3 * SCRAPE_SECONDS)  # rules evaluated after the first scrapes

        states, stop = AlertStates(), asyncio.Event()
        watcher = asyncio.create_task(states.watch(prometheus, stop))
        try:
            start = time.time()
            found = await wait_workload_done(runs, await run_workload(runs))
            await assert_counters_agree(prometheus, runs, found)

            async def expected_alerts() -> bool:
                return states.active() >= EXPECTED_ALERTS

            with contextlib.suppress(AssertionError):
                await until(expected_alerts, "the workload's alerts to be pending", 60)
        finally:
            stop.set()
            await asyncio.gather(watcher, return_exceptions=True)
        watcher.result()  # a watch that failed has not seen every state

        # The alerts this workload should trigger reached pending (or firing); no other left inactive.
        rules = await prometheus.alerting_rules()
        assert not states.unhealthy, states.unhealthy
        assert states.active() == EXPECTED_ALERTS, {
            "reached": states.reached,
            "active alerts": {n: r["alerts"] for n, r in rules.items() if r["alerts"]},
            "counted": {
                expr: await prometheus.query(expr)
                for expr in (
                    "sum by (stop_reason) (agentrun:runs_finished:increase30m)",
                    "sum by (tool, outcome) (agentrun:tool_calls:increase15m)",
                    "sum by (model, outcome) (agentrun:model_requests:increase10m)",
                )
            },
        }

        # Every dashboard query has something to draw over the workload's range, or needs a situation
        # this workload does not make. The range ends once Prometheus has scraped a rate interval past
        # the last run's end, as a dashboard looked at afterwards would show it.
        settled = time.time() + rate_interval_seconds()

        async def scraped_past_the_workload() -> bool:
            return any(float(s["value"][1]) >= settled for s in await prometheus.query("timestamp(up)"))

        await until(scraped_past_the_workload, "Prometheus to scrape a rate interval past the workload", 30)
        end = time.time()
        empty = {}
        for key, expr in dashboard_queries(start, end).items():
            if not has_a_value(await prometheus.query_range(expr, start, end, STEP_SECONDS)):
                empty[key] = expr
        stored = {}
        for expr in empty.values():
            for metric in set(re.findall(r"\bagentrun_[a-z_]+", expr)):
                series = await prometheus.query_range(metric, start, end, SCRAPE_SECONDS)
                stored[metric] = [(s["metric"], len(s["values"])) for s in series]
        queries = dashboard_queries(start, end)
        print(
            f"\nreal Prometheus: {len(queries) - len(empty)} of {len(queries)} dashboard queries with data; "
            f"alerts reached: {json.dumps({n: st for n, st in states.reached.items() if st != 'inactive'})}; "
            f"{len(found)} runs in {end - start:.0f} s"
        )
        assert set(empty) == set(NEEDS_A_SITUATION), {"empty": empty, "stored samples": stored}
