"""Alert rules and the Grafana dashboard, checked with the real `promtool`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from agentrun.metrics.definitions import Metrics
from tests.chart.tooling import CHART, MONITORING_API, REPO, Renderer, Tool, one

RULES = CHART / "rules" / "agentrun.rules.yaml"
RULE_TESTS = Path(__file__).parent / "promtool" / "agentrun.rules.test.yaml"
DASHBOARD = CHART / "dashboards" / "agentrun.json"
ALERTS_DOC = REPO / "docs" / "alerts.md"
METRICS = [
    "agentrun_runs_started_total",
    "agentrun_runs_finished_total",
    "agentrun_runs_active",
    "agentrun_runs_queued",
    "agentrun_oldest_running_run_age_seconds",
    "agentrun_run_iterations_bucket",
    "agentrun_run_duration_seconds_bucket",
    "agentrun_model_requests_total",
    "agentrun_model_retries_total",
    "agentrun_model_request_duration_seconds_bucket",
    "agentrun_tokens_total",
    "agentrun_cost_usd_total",
    "agentrun_tool_calls_total",
    "agentrun_tool_call_duration_seconds_bucket",
    "agentrun_loop_detections_total",
    "agentrun_tool_calls_recovered_from_text_total",
    "agentrun_approvals_pending",
    "agentrun_approvals_decided_total",
    "agentrun_operator_heartbeat_timestamp_seconds",
    "agentrun_build_info",
    "agentrun_quota_hard",
    "agentrun_quota_used",
    "agentrun_quota_reserved",
    "agentrun_quota_lost_reservations",
    "agentrun_quota_refusals_total",
    "agentrun_child_runs_created_total",
    "agentrun_child_runs_active",
    "agentrun_runs_started_by_depth_total",
    "agentrun_schedule_runs_total",
    "agentrun_schedule_next_run_timestamp_seconds",
    "agentrun_replica_members",
    "agentrun_replica_runs_owned",
    "agentrun_replica_handoffs_total",
    "agentrun_replica_fenced",
    "agentrun_replica_event_loop_lag_seconds",
]
EXPECTED_ALERTS = {
    "AgentRunOperatorDown",
    "AgentRunOperatorHeartbeatStale",
    "AgentRunHighLoopRate",
    "AgentRunToolErrorRateHigh",
    "AgentRunModelErrorRateHigh",
    "AgentRunCostBurnHigh",
    "AgentRunStuck",
    "AgentRunModelLatencyHigh",
    "AgentRunQuotaCostAbove80Percent",
    "AgentScheduleMissedRuns",
    "AgentRunReplicaFenced",
    "AgentRunReplicaEventLoopLagging",
    "AgentRunReplicaHandoffsChurning",
}


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def doc_anchors() -> set[str]:
    """GitHub's anchors of the `##`/`###` headings of docs/alerts.md."""
    anchors = set()
    for line in ALERTS_DOC.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def dashboard_panels() -> list[dict[str, Any]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [p for p in panels if p["type"] != "row"]


def test_promtool_check_rules_accepts_the_rules_file(promtool: Tool) -> None:
    proc = promtool.run("check", "rules", RULES)
    assert "SUCCESS" in proc.stdout


def test_promtool_unit_tests_of_every_alert_pass(promtool: Tool) -> None:
    proc = promtool.run("test", "rules", RULE_TESTS)
    assert "SUCCESS" in proc.stdout


def test_the_rules_cover_loops_errors_cost_stuck_runs_health_latency_quotas_schedules_replicas() -> None:
    assert {rule["alert"] for rule in alert_rules()} == EXPECTED_ALERTS


def test_every_alert_has_a_promtool_case_that_fires_and_one_that_does_not() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    assert firing == EXPECTED_ALERTS, EXPECTED_ALERTS - firing
    assert quiet == EXPECTED_ALERTS, EXPECTED_ALERTS - quiet


def test_every_alert_has_a_summary_a_description_and_a_runbook_section_in_docs_alerts_md() -> None:
    anchors = doc_anchors()
    for rule in alert_rules():
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), rule["alert"]
        url = annotations["runbook_url"]
        assert url.startswith("https://") and "/docs/alerts.md#" in url, url
        anchor = url.rpartition("#")[2]
        assert anchor == rule["alert"].lower(), url
        assert anchor in anchors, f"docs/alerts.md has no section for {rule['alert']}"
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_alert_thresholds_from_values_reach_the_rendered_prometheus_rule(renderer: Renderer) -> None:
    thresholds = {
        "loopRate": 0.35,
        "toolErrorRate": 0.75,
        "modelErrorRate": 0.05,
        "costUSDPerHour": 2.5,
        "stuckRunSeconds": 900,
        "heartbeatStaleSeconds": 300,
        "modelLatencyP95Seconds": 20,
    }
    values = {"metrics": {"prometheusRule": {"enabled": True, "thresholds": thresholds}}}
    rule = one(renderer.render(values, api_versions=[MONITORING_API]), "PrometheusRule")
    recorded = {
        r["record"]: r["expr"]
        for group in rule["spec"]["groups"]
        for r in group["rules"]
        if r.get("record", "").startswith("agentrun:alert_threshold:")
    }
    assert recorded == {
        "agentrun:alert_threshold:loop_rate": "vector(0.35)",
        "agentrun:alert_threshold:tool_error_rate": "vector(0.75)",
        "agentrun:alert_threshold:model_error_rate": "vector(0.05)",
        "agentrun:alert_threshold:cost_usd_per_hour": "vector(2.5)",
        "agentrun:alert_threshold:stuck_run_seconds": "vector(900)",
        "agentrun:alert_threshold:heartbeat_stale_seconds": "vector(300)",
        "agentrun:alert_threshold:model_latency_p95_seconds": "vector(20)",
    }
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]
    assert alerts == alert_rules()


def test_a_threshold_outside_its_range_is_rejected_at_install_time(renderer: Renderer) -> None:
    values = {"metrics": {"prometheusRule": {"thresholds": {"loopRate": 1.5}}}}
    proc = renderer.template(values, check=False)
    assert proc.returncode != 0
    assert "loopRate" in proc.stderr


def test_every_dashboard_query_is_valid_promql(promtool: Tool, tmp_path: Path) -> None:
    # promtool parses PromQL in recording rules; Grafana's variables become plain values first.
    grafana_variables = {"$__rate_interval": "5m", "$__range": "1h", "$job": ".*"}
    rules = []
    for number, panel in enumerate(dashboard_panels()):
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in grafana_variables.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"unknown Grafana variable in {panel['title']!r}: {expr}"
            rules.append({"record": f"dashboard:panel_{number}:{target['refId']}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool.run("check", "rules", path)


def test_dashboard_shows_every_operator_metric() -> None:
    queries = " ".join(t["expr"] for p in dashboard_panels() for t in p["targets"])
    missing = [metric for metric in METRICS if not re.search(rf"\b{metric}\b", queries)]
    assert not missing, f"no dashboard panel queries {missing}"


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """The sample names a scrape can contain for each registered family, whether or not it has samples yet."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix for family in registry.collect() for suffix in suffixes.get(family.type, ("",))
    }


def test_every_operator_metric_a_dashboard_panel_or_an_alert_queries_is_one_the_operator_registers() -> None:
    # The real scrape (tests/integration/test_observability.py) shows only series that have samples;
    # this holds for metrics that have none until something happens, like a quota's.
    registered = exposed_names(Metrics(CollectorRegistry()).registry)
    queries = [t["expr"] for p in dashboard_panels() for t in p["targets"]]
    queries += [str(rule["expr"]) for rule in alert_rules()]
    for expr in queries:
        unknown = set(re.findall(r"\bagentrun_[a-z0-9_]+", expr)) - registered
        assert not unknown, f"{expr!r} names metrics the operator does not register: {unknown}"


def test_the_quota_row_shows_used_against_hard_reservations_refusals_and_lost_reservations() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Quotas")
    end = next((i for i, p in enumerate(panels) if i > start and p["type"] == "row"), len(panels))
    queries = " ".join(t["expr"] for p in panels[start + 1 : end] for t in p["targets"])
    for metric in (
        "agentrun_quota_used",
        "agentrun_quota_hard",
        "agentrun_quota_reserved",
        "agentrun_quota_refusals_total",
        "agentrun_quota_lost_reservations",
    ):
        assert re.search(rf"\b{metric}\b", queries), f"the Quotas row does not query {metric}"
    assert "by (namespace, quota, resource)" in queries


def test_the_agents_row_shows_children_created_and_active_runs_by_depth_and_what_schedules_did() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    start = next(
        i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Agents and schedules"
    )
    end = next((i for i, p in enumerate(panels) if i > start and p["type"] == "row"), len(panels))
    queries = [t["expr"] for p in panels[start + 1 : end] for t in p["targets"]]
    text = " ".join(queries)
    for metric in (
        "agentrun_child_runs_created_total",
        "agentrun_child_runs_active",
        "agentrun_runs_started_by_depth_total",
        "agentrun_schedule_runs_total",
        "agentrun_schedule_next_run_timestamp_seconds",
    ):
        assert re.search(rf"\b{metric}\b", text), f"the Agents and schedules row does not query {metric}"
    assert any("by (depth)" in q and "agentrun_runs_started_by_depth_total" in q for q in queries)
    assert any("by (result)" in q and "agentrun_schedule_runs_total" in q for q in queries)
    # A wait, not a date: the next run's timestamp minus now.
    assert any(
        "agentrun_schedule_next_run_timestamp_seconds" in q and q.endswith("- time()") for q in queries
    )


def test_the_replicas_row_shows_runs_owned_handoffs_fenced_members_and_event_loop_lag_per_replica() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Replicas")
    end = next((i for i, p in enumerate(panels) if i > start and p["type"] == "row"), len(panels))
    queries = [t["expr"] for p in panels[start + 1 : end] for t in p["targets"]]
    for metric in (
        "agentrun_replica_runs_owned",
        "agentrun_replica_handoffs_total",
        "agentrun_replica_fenced",
        "agentrun_replica_members",
        "agentrun_replica_event_loop_lag_seconds",
    ):
        # One line per replica: summing over replicas would hide the one that misbehaves.
        assert any(re.search(rf"\b{metric}\b", q) and "by (replica" in q for q in queries), (
            f"the Replicas row does not query {metric} per replica"
        )
    assert any("by (replica, direction)" in q and "agentrun_replica_handoffs_total" in q for q in queries)


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_dashboard_panels_have_unique_ids_titles_and_a_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in dashboard_panels()]
    assert len(titles) == len(set(titles))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard_panels():
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["description"], panel["title"]
