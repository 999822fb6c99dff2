"""Alert rules and the Grafana dashboard, checked with the real `promtool`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.chart.tooling import CHART, Tool

RULES = CHART / "rules" / "agentrun.rules.yaml"
RULE_TESTS = Path(__file__).parent / "promtool" / "agentrun.rules.test.yaml"
DASHBOARD = CHART / "dashboards" / "agentrun.json"
METRICS = [
    "agentrun_runs_started_total",
    "agentrun_runs_finished_total",
    "agentrun_runs_active",
    "agentrun_runs_queued",
    "agentrun_run_iterations_bucket",
    "agentrun_model_request_duration_seconds_bucket",
    "agentrun_tokens_total",
    "agentrun_cost_usd_total",
]


def dashboard_panels() -> list[dict[str, Any]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [p for p in panels if p["type"] != "row"]


def test_promtool_check_rules_accepts_the_rules_file(promtool: Tool) -> None:
    proc = promtool.run("check", "rules", RULES)
    assert "SUCCESS" in proc.stdout


def test_operator_down_alert_fires_only_when_no_operator_target_is_up(promtool: Tool) -> None:
    proc = promtool.run("test", "rules", RULE_TESTS)
    assert "SUCCESS" in proc.stdout


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
