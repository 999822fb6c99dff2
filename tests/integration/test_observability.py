"""Observability of the real operator process: a scripted workload, then its scrape, Events and logs.

The chart's dashboard and alert rules are checked against the same real scrape: every metric a
query names must be one the operator exports after the workload. The workload runs under an
AgentRunQuota, so the quota metrics are in the scrape too, equal to the quota's own status. Then a
parent run delegates to a child through an agent tool and an AgentSchedule creates a run, so the
metrics of the dashboard's "Agents and schedules" row are in the scrape as well.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.metrics.observing import UNDECLARED_TOOL
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import HttpError, Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.chart.tooling import find_tool
from tests.support.builders import agentrun
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.kube_requests import FINISHED, until, wait_finished
from tests.support.operator_process import OperatorProcess
from tests.support.prometheus import running_prometheus
from tests.support.quotas import create_quota, install_quota_crd, quota_status
from tests.support.schedules import install_schedule_crd

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "agentrun-operator"
API_KEY = "sk-ant-observability-secret-0123456789"
CALC = [{"builtin": {"name": "calculator"}}]
MODEL = {"name": "claude-haiku-4-5"}
#: Room for the whole workload: the quota counts it and limits nothing.
QUOTA = "obs-budget"
QUOTA_HARD = {"concurrentRuns": 10, "runs": 100, "tokens": 10_000_000, "costUSD": 100}
AGENT = "obs-researcher"
#: The chart always gives the operator a Lease namespace, so its scrape has the replica gauges too.
REPLICA = "obs-replica"
#: Series that have no sample until something this workload never does happens; tests/chart checks
#: that the operator registers them.
NEEDS_AN_EVENT = {"agentrun_replica_handoffs_total"}  # runs move only when replicas join or leave


def _scripts() -> list[Script]:
    calc = tool_use_block("calculator", {"expression": "6*7"}, id="toolu_obs1")
    bogus = tool_use_block("no_such_tool", {"q": "x"}, id="toolu_obs2")
    same = tool_use_block("calculator", {"expression": "1+1"})
    as_text = '<tool_use>{"name": "calculator", "input": {"expression": "2+2"}}</tool_use>'
    return [
        Script(
            "[scenario:obs-tools]",
            [
                Reply(
                    [calc, bogus],
                    usage=ScriptUsage(200, 40, 100, 50),
                    faults=[HttpError.rate_limit(retry_after=0.05, times=2)],
                ),
                Reply([text_block("42.")], usage=ScriptUsage(300, 10, 0, 150)),
            ],
        ),
        Script("[scenario:obs-loop]", [Reply([same], usage=ScriptUsage(100, 20)) for _ in range(4)]),
        Script(
            "[scenario:obs-text]",
            [Reply([text_block(as_text)], usage=ScriptUsage(80, 20)), Reply([text_block("4.")])],
        ),
        Script(
            "[scenario:obs-fatal]",
            [HttpError(status=400, error_type="invalid_request_error", message="bad request")],
        ),
        Script(
            "[scenario:obs-parent]",
            [
                Reply(
                    [tool_use_block("research", {"task": "[scenario:obs-child] look it up"}, id="toolu_obs3")]
                ),
                Reply([text_block("The child found it.")]),
            ],
        ),
        Script("[scenario:obs-child]", [Reply([text_block("Found it.")], usage=ScriptUsage(50, 5))]),
        Script("[scenario:obs-scheduled]", [Reply([text_block("Checked.")], usage=ScriptUsage(40, 4))]),
        Script(
            "[scenario:obs-ghosts]",
            [
                Reply([calc, *(tool_use_block(f"ghost_v{i}", {"q": i}) for i in range(5))]),
                Reply([tool_use_block(f"ghost_v{i}", {"q": i}) for i in range(5, 10)]),
                *(Reply([tool_use_block("ghost_same", {"q": "again"})]) for _ in range(3)),
            ],
        ),
    ]


WORKLOAD = {
    "obs-tools": ("[scenario:obs-tools] multiply", "Succeeded"),
    "obs-loop": ("[scenario:obs-loop] loop", "Failed"),
    "obs-text": ("[scenario:obs-text] text call", "Succeeded"),
    "obs-fatal": ("[scenario:obs-fatal] fatal", "Failed"),
}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    async with FakeMessagesAPI(scripts=_scripts(), require_api_key=API_KEY).running() as server:
        yield server


async def _operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path, *args: str
) -> AsyncIterator[OperatorProcess]:
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_HEARTBEAT_SECONDS": "0.2",
        "AGENTRUN_LEASE_NAMESPACE": cluster.namespace,
        "AGENTRUN_REPLICA_NAME": REPLICA,
        "AGENTRUN_REPLICA_GROUP": f"obs-{secrets.token_hex(4)}",
    }
    await install_quota_crd(cluster)
    await install_schedule_crd(cluster)
    async with cluster.operator(tmp_path / "operator.log", env, args) as process:
        yield process


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    async for process in _operator(cluster, model, tmp_path):
        yield process


@pytest.fixture
async def json_operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    async for process in _operator(cluster, model, tmp_path, "--log-format", "json"):
        yield process


async def _run_workload(cluster: TestCluster) -> dict[str, dict[str, Any]]:
    await create_quota(cluster, QUOTA, hard=QUOTA_HARD)
    for name, (task, _) in WORKLOAD.items():
        run = agentrun(name, task, namespace=cluster.namespace, model=MODEL, tools=CALC)
        await cluster.request("POST", cluster.runs_path, json=run)

    async def runs() -> dict[str, dict[str, Any]]:
        return {name: await cluster.request("GET", f"{cluster.runs_path}/{name}") for name in WORKLOAD}

    finished = await until(
        runs,
        "the workload to finish",
        90,
        done=lambda seen: all(o.get("status", {}).get("phase") in FINISHED for o in seen.values()),
        every=0.2,
        explain=lambda seen: f"phases: { {n: o.get('status', {}).get('phase') for n, o in seen.items()} }",
    )
    phases = {name: obj["status"]["phase"] for name, obj in finished.items()}
    assert phases == {name: phase for name, (_, phase) in WORKLOAD.items()}
    return finished


async def _run_agents_and_schedule(cluster: TestCluster) -> None:
    """A parent whose agent tool runs a child from an Agent, and a schedule due every minute: waits
    until the parent has finished and the schedule has created its first run (within a minute)."""
    agent = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": AGENT, "namespace": cluster.namespace},
        "spec": {"systemPrompt": "You look one thing up.", "model": MODEL},
    }
    await cluster.request("POST", cluster.path("agents", api=RUNS_API), json=agent)
    tool = {"agent": {"name": "research", "agentRef": {"name": AGENT}, "description": "Looks one thing up."}}
    parent = agentrun(
        "obs-parent", "[scenario:obs-parent] delegate", namespace=cluster.namespace, model=MODEL
    )
    parent["spec"]["tools"] = [tool]
    await cluster.request("POST", cluster.runs_path, json=parent)
    schedule = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentSchedule",
        "metadata": {"name": "obs-minutely", "namespace": cluster.namespace},
        "spec": {
            "schedule": "* * * * *",
            "agentRef": {"name": AGENT},
            "task": "[scenario:obs-scheduled] check at {{scheduledTime}}",
        },
    }
    await cluster.request("POST", cluster.path("agentschedules", api=RUNS_API), json=schedule)

    async def parent_and_schedule() -> tuple[dict[str, Any], dict[str, Any]]:
        parent = await cluster.request("GET", f"{cluster.runs_path}/obs-parent")
        schedule = await cluster.request("GET", cluster.path("agentschedules", "obs-minutely", api=RUNS_API))
        return parent.get("status") or {}, schedule.get("status") or {}

    await until(
        parent_and_schedule,
        "the parent to succeed and the schedule to create its first run",
        150,
        done=lambda seen: seen[0].get("phase") == "Succeeded" and seen[1].get("lastScheduleTime"),
        every=0.5,
        explain=lambda seen: f"parent: {seen[0]}; schedule: {seen[1]}",
    )


def _samples(scrape: str) -> dict[str, float]:
    """`name{labels}` → value for every sample line."""
    samples = {}
    for line in scrape.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def _exported(scrape: str) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in scrape.splitlines() if line and line[0] != "#"}


# PromQL keywords and functions; `up` is Prometheus's own series about the scrape, not exported.
PROMQL_WORDS = {
    "sum", "rate", "irate", "increase", "by", "without", "on", "ignoring", "group_left", "group_right",
    "histogram_quantile", "max", "min", "avg", "count", "clamp_min", "clamp_max", "absent", "time",
    "vector", "scalar", "topk", "bottomk", "and", "or", "unless", "le", "offset", "bool", "max_over_time",
    "min_over_time", "avg_over_time", "label_replace", "up", "changes", "resets", "deriv", "delta",
    "absent_over_time", "sort_desc", "sort", "round", "abs", "count_over_time", "last_over_time",
}  # fmt: skip


def _metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression: identifiers outside label matchers and strings."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    stripped = re.sub(r"\{[^}]*\}", "{}", stripped)
    stripped = re.sub(r"\[[^\]]*\]", "[]", stripped)
    stripped = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", stripped)
    names = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", stripped))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d.*|e\d*|[smhdwy]", n)}


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((CHART / "dashboards" / "agentrun.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            exprs.append(re.sub(r"label_values\(([^,]+),.*\)", r"\1", variable["query"]["query"]))
    return [e.replace("$__rate_interval", "5m").replace("$__range", "1h") for e in exprs]


def _rule_exprs() -> list[str]:
    rules = yaml.safe_load((CHART / "rules" / "agentrun.rules.yaml").read_text())
    return [str(rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def _recorded() -> set[str]:
    rules = yaml.safe_load((CHART / "rules" / "agentrun.rules.yaml").read_text())
    return {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}


async def test_a_scripted_workload_exports_every_documented_metric_and_promtool_accepts_the_scrape(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    runs = await _run_workload(cluster)
    scrape = await operator.scrape()
    samples = _samples(scrape)
    ns = f'namespace="{cluster.namespace}"'

    assert samples[f'agentrun_runs_started_total{{{ns},resumed="false"}}'] == 4
    assert samples[f'agentrun_runs_finished_total{{{ns},outcome="failed",stop_reason="LoopDetected"}}'] == 1
    assert samples[f'agentrun_runs_finished_total{{{ns},outcome="failed",stop_reason="ModelError"}}'] == 1
    assert samples['agentrun_model_retries_total{retry_class="rate_limited"}'] == 2
    assert samples['agentrun_model_requests_total{model="claude-haiku-4-5",outcome="rate_limited"}'] == 2
    assert samples['agentrun_model_requests_total{model="claude-haiku-4-5",outcome="error"}'] == 1
    assert samples[f'agentrun_tokens_total{{model="claude-haiku-4-5",{ns},type="cache_write"}}'] == 100
    assert samples[f'agentrun_tokens_total{{model="claude-haiku-4-5",{ns},type="cache_read"}}'] == 200
    assert samples['agentrun_tool_calls_total{outcome="ok",tool="calculator"}'] >= 2
    assert samples[f'agentrun_tool_calls_total{{outcome="unknown_tool",tool="{UNDECLARED_TOOL}"}}'] == 1
    assert samples['agentrun_loop_detections_total{tool="calculator"}'] == 1
    assert samples['agentrun_tool_calls_recovered_from_text_total{tool="calculator"}'] == 1
    assert samples["agentrun_runs_active"] == 0
    assert samples["agentrun_runs_queued"] == 0
    assert samples[f"agentrun_runs_queued_by_namespace{{{ns}}}"] == 0
    assert samples["agentrun_approvals_pending"] == 0
    assert samples["agentrun_oldest_running_run_age_seconds"] == 0
    assert samples[f"agentrun_run_iterations_count{{{ns}}}"] == 4
    assert samples[f"agentrun_run_duration_seconds_count{{{ns}}}"] == 4
    # Spend is counted per response and adds up to what the runs' status reports.
    status_cost = sum(float(obj["status"]["usage"].get("costUSD") or 0) for obj in runs.values())
    assert samples[f"agentrun_cost_usd_total{{{ns}}}"] == pytest.approx(status_cost, abs=1e-5)
    build = next(k for k in samples if k.startswith("agentrun_build_info{"))
    assert re.search(r'anthropic="\d', build) and re.search(r'kopf="\d', build) and 'version="' in build
    # The heartbeat moves while the operator lives.
    first = samples["agentrun_operator_heartbeat_timestamp_seconds"]

    async def heartbeat() -> float:
        return _samples(await operator.scrape())["agentrun_operator_heartbeat_timestamp_seconds"]

    await until(heartbeat, "the heartbeat to move", 30, done=lambda beat: beat > first, every=0.2)
    # No per-run label anywhere.
    assert not re.search(r'(name|uid|run)="obs-', scrape)

    # The quota gauges follow the quota's status (written by the ledger, seen through the watch).
    quota = f'namespace="{cluster.namespace}",quota="{QUOTA}"'

    async def quota_and_gauges() -> tuple[dict[str, Any], dict[str, float]]:
        return await quota_status(cluster, QUOTA), _samples(await operator.scrape())

    def caught_up(seen: tuple[dict[str, Any], dict[str, float]]) -> bool:
        used, samples = seen[0].get("used") or {}, seen[1]
        return (
            used.get("runs") == len(WORKLOAD)
            and used.get("concurrentRuns") == 0
            and samples.get(f'agentrun_quota_used{{{quota},resource="runs"}}') == len(WORKLOAD)
            and samples.get(f'agentrun_quota_used{{{quota},resource="concurrentRuns"}}') == 0
        )

    status, samples = await until(
        quota_and_gauges,
        "the quota's status and gauges to count the workload",
        30,
        done=caught_up,
        every=0.2,
        explain=lambda seen: f"quota status: {seen[0]}",
    )
    used = status["used"]
    for resource, value in QUOTA_HARD.items():
        assert samples[f'agentrun_quota_hard{{{quota},resource="{resource}"}}'] == value
    assert samples[f'agentrun_quota_used{{{quota},resource="runs"}}'] == len(WORKLOAD)
    assert samples[f'agentrun_quota_used{{{quota},resource="concurrentRuns"}}'] == 0
    assert samples[f'agentrun_quota_used{{{quota},resource="tokens"}}'] == used["tokens"]
    assert samples[f'agentrun_quota_used{{{quota},resource="costUSD"}}'] == pytest.approx(
        float(used["costUSD"]), abs=1e-9
    )
    assert float(used["costUSD"]) == pytest.approx(status_cost, abs=1e-5)
    assert samples[f'agentrun_quota_reserved{{{quota},resource="tokens"}}'] == 0
    assert samples[f"agentrun_quota_lost_reservations{{{quota}}}"] == 0

    # Agents and schedules: a child run (depth 1) and a scheduled run.
    await _run_agents_and_schedule(cluster)
    scrape = await operator.scrape()
    samples = _samples(scrape)
    assert samples[f'agentrun_child_runs_created_total{{agent="{AGENT}",{ns}}}'] == 1
    assert samples[f"agentrun_child_runs_active{{{ns}}}"] == 0
    assert samples[f'agentrun_runs_started_by_depth_total{{depth="1",{ns}}}'] == 1
    assert samples[f'agentrun_schedule_runs_total{{{ns},result="created",schedule="obs-minutely"}}'] >= 1
    # The next minute (as of the schedule's last pass, a moment ago).
    next_run = samples[f'agentrun_schedule_next_run_timestamp_seconds{{{ns},schedule="obs-minutely"}}']
    assert time.time() - 10 < next_run <= time.time() + 61

    # One replica alone: it sees itself and is not fenced (it owns what the schedule may still run).
    replica = f'replica="{REPLICA}"'
    assert samples[f"agentrun_replica_members{{{replica}}}"] == 1
    assert samples[f"agentrun_replica_fenced{{{replica}}}"] == 0
    assert f"agentrun_replica_runs_owned{{{replica}}}" in samples
    assert 0 <= samples[f"agentrun_replica_event_loop_lag_seconds{{{replica}}}"] < 10

    promtool = find_tool("promtool")
    assert promtool is not None, "promtool is needed: run `make tools`"
    proc = await asyncio.create_subprocess_exec(
        str(promtool), "check", "metrics", stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    output, _ = await proc.communicate(scrape.encode())
    assert proc.returncode == 0, output.decode()

    exported = _exported(scrape)
    recorded = _recorded()
    for source, exprs in (("dashboard", _dashboard_exprs()), ("rules", _rule_exprs())):
        for expr in exprs:
            missing = _metric_names(expr) - exported - recorded - NEEDS_AN_EVENT
            assert not missing, (
                f"{source} query {expr!r} names metrics the operator does not export: {missing}"
            )


#: The metric families labelled by tool (a histogram's series are its _bucket, _count and _sum).
TOOL_LABELLED = "agentrun_tool_call.*|agentrun_loop_detections_total"


async def test_tool_names_a_model_invents_are_scraped_as_one_undeclared_bucket_beside_the_declared_tools(
    cluster: TestCluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Eleven invented names (one of them looping) leave two tool label values: calculator and the bucket."""
    run = agentrun(
        "obs-ghosts", "[scenario:obs-ghosts] go", namespace=cluster.namespace, model=MODEL, tools=CALC
    )
    await cluster.request("POST", cluster.runs_path, json=run)
    finished = await wait_finished(cluster, "obs-ghosts", timeout=60)
    assert finished["status"]["stopReason"] == "LoopDetected", finished["status"]

    samples = _samples(await operator.scrape())
    tools = {
        match.group(1)
        for key in samples
        if re.match(TOOL_LABELLED, key)
        for match in [re.search(r'tool="([^"]*)"', key)]
        if match
    }
    assert tools == {"calculator", UNDECLARED_TOOL}
    assert samples[f'agentrun_tool_calls_total{{outcome="unknown_tool",tool="{UNDECLARED_TOOL}"}}'] == 13
    assert samples['agentrun_tool_calls_total{outcome="ok",tool="calculator"}'] == 1
    assert samples[f'agentrun_loop_detections_total{{tool="{UNDECLARED_TOOL}"}}'] == 1

    # What a Prometheus scraping the operator stores: the same two values, however many names were invented.
    job = {
        "job_name": "agentrun-operator",
        "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}],
    }
    async with running_prometheus(tmp_path / "prometheus", [job]) as prometheus:
        by_tool = f'count by (tool) ({{__name__=~"{TOOL_LABELLED}"}})'

        async def scraped() -> bool:
            return bool(await prometheus.query(by_tool))

        await until(scraped, "Prometheus to store a scrape of the operator", timeout=30)
        assert set(await prometheus.by_label(by_tool, "tool")) == {"calculator", UNDECLARED_TOOL}


async def test_runs_get_kubernetes_events_for_start_outcomes_retries_and_model_errors(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    runs = await _run_workload(cluster)
    invalid = agentrun(
        "obs-invalid",
        "x",
        namespace=cluster.namespace,
        model=MODEL,
        # The CRD refuses an unknown tool name at the API server; a built-in's config it cannot check.
        tools=[{"builtin": {"name": "calculator", "config": {"precision": 3}}}],
    )
    runs["obs-invalid"] = await cluster.request("POST", cluster.runs_path, json=invalid)
    await until(
        lambda: cluster.request("GET", cluster.path("events")),
        "an Event of obs-invalid",
        60,
        done=lambda events: any(e["involvedObject"]["name"] == "obs-invalid" for e in events["items"]),
        every=0.2,
        explain=lambda _: "",
    )
    events = (await cluster.request("GET", cluster.path("events")))["items"]
    by_run: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        involved = event["involvedObject"]
        if involved.get("kind") == "AgentRun":
            assert involved["uid"] == runs[involved["name"]]["metadata"]["uid"]
            by_run.setdefault(involved["name"], []).append(event)
    reasons = {name: {(e["type"], e["reason"]) for e in items} for name, items in by_run.items()}
    # A run's start is in its status (startTime, Running), not an Event.
    assert {("Normal", "EndTurn"), ("Warning", "ModelRetry")} <= reasons["obs-tools"]
    assert {("Warning", "LoopDetected")} <= reasons["obs-loop"]
    assert {("Warning", "ModelError")} <= reasons["obs-fatal"]
    assert not any(reason == "Started" for found in reasons.values() for _, reason in found)
    # A run that never starts its loop still says why, on the run itself.
    [invalid_event] = by_run["obs-invalid"]
    assert (invalid_event["type"], invalid_event["reason"]) == ("Warning", "InvalidSpec")
    assert "spec.tools[0].builtin.config: calculator: calculator takes no config" in invalid_event["message"]
    retries = [e for e in by_run["obs-tools"] if e["reason"] == "ModelRetry"]
    assert len(retries) == 1 and retries[0]["count"] == 2, "repeated retries are aggregated into one Event"
    for items in by_run.values():
        for event in items:
            assert len(event["message"]) <= 512
            assert API_KEY not in event["message"]
            assert "6*7" not in event["message"], "tool input never goes into an Event"
    # The human-readable log names the run and the iteration on its lines.
    assert re.search(rf"\[{cluster.namespace}/obs-tools #1\] iteration 1: model request ok", operator.logs())
    # The garbage collector's pace of the operator (controller/collector.py), at its setting's default.
    assert "garbage collection of the youngest generation after 50000 new objects" in operator.logs()


async def test_json_logs_carry_the_run_identity_and_iteration_on_every_run_line(
    cluster: TestCluster, json_operator: OperatorProcess
) -> None:
    runs = await _run_workload(cluster)
    await json_operator.stop()
    lines = [json.loads(line) for line in json_operator.logs().splitlines() if line.startswith("{")]
    assert lines, json_operator.logs()
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    per_run = [line for line in lines if "uid" in line]
    assert {line["name"] for line in per_run} >= set(WORKLOAD)
    for line in per_run:
        assert line["namespace"] == cluster.namespace
        assert line["uid"] == runs[line["name"]]["metadata"]["uid"]
        # Kopf's own lines about the object (daemon start/stop) come before or after the loop.
        assert isinstance(line.get("iteration"), int) or line["logger"].startswith("kopf"), line
    model_lines = [line for line in per_run if line["message"].startswith("iteration ")]
    assert model_lines
    for line in model_lines:
        assert line["message"].startswith(f"iteration {line['iteration']}:")
    finished = [line for line in per_run if line["message"].startswith("finished: ")]
    assert {line["name"] for line in finished} == set(WORKLOAD)
