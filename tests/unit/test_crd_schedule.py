"""The AgentSchedule CRD is generated from api/schedule.py: committed, with the chart's copy and the
reference page equal to the generator's output, runSpec free of stored defaults, and the rules CEL
states enforced by the models too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from agentrun.api.crd import schedule_crd, schedule_crd_yaml
from agentrun.api.reference import reference_markdown
from agentrun.api.schedule import AgentScheduleSpec, AgentScheduleStatus
from agentrun.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = "agentschedules.agentrun.dev.yaml"
REFERENCE = ROOT / "docs" / "reference" / "agentschedule.md"
SPEC: dict[str, Any] = {
    "schedule": "0 6 * * *",
    "agentRef": {"name": "reporter"},
    "task": "Report {{scheduledTime}}",
}


def _spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = schedule_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]


def _defaults(node: Any) -> list[Any]:
    if isinstance(node, list):
        return [d for item in node for d in _defaults(item)]
    if not isinstance(node, dict):
        return []
    return ([node["default"]] if "default" in node else []) + [d for v in node.values() for d in _defaults(v)]


def test_the_committed_crd_and_the_charts_copy_are_what_the_generator_writes() -> None:
    assert (ROOT / "crds" / CRD_FILE).read_text() == schedule_crd_yaml()
    assert (ROOT / "charts" / "agentrun-operator" / "crds" / CRD_FILE).read_text() == schedule_crd_yaml()


def test_crd_command_prints_the_crd_and_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd", "--kind", "AgentSchedule"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["spec"]["names"]["shortNames"] == ["ags"]
    assert main(["crd", "--kind", "AgentSchedule", "--reference"]) == 0
    assert capsys.readouterr().out == REFERENCE.read_text() == reference_markdown(schedule_crd())


def test_run_spec_stores_no_defaults_so_what_a_schedule_leaves_out_stays_the_agents() -> None:
    run_spec = _spec_schema()["properties"]["runSpec"]
    assert _defaults(run_spec) == []
    assert "Default 20" in run_spec["properties"]["limits"]["properties"]["maxIterations"]["description"]


def test_run_spec_offers_only_what_a_run_with_an_agent_may_set() -> None:
    fields = set(_spec_schema()["properties"]["runSpec"]["properties"])
    assert fields == {"model", "limits", "output", "toolChoice", "priority", "ttlSecondsAfterFinished"}


def test_the_printer_columns_show_schedule_suspend_last_and_next_times() -> None:
    columns = [c["name"] for c in schedule_crd()["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns == ["Schedule", "Time Zone", "Agent", "Suspend", "Last Schedule", "Next", "Age"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"concurrencyPolicy": "Sometimes"}, "concurrencyPolicy"),
        ({"successfulRunsHistoryLimit": -1}, "successfulRunsHistoryLimit"),
        ({"failedRunsHistoryLimit": -1}, "failedRunsHistoryLimit"),
        ({"startingDeadlineSeconds": 0}, "startingDeadlineSeconds"),
        ({"runSpec": {"tools": []}}, "runSpec.tools"),
        ({"runSpec": {"priority": 5000}}, "runSpec.priority"),
        ({"agentRef": {"name": "Not_A_Label"}}, "agentRef.name"),
    ],
)
def test_the_models_refuse_what_the_crd_refuses(change: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message.replace(".", r"\.")):
        AgentScheduleSpec.model_validate({**SPEC, **change})


def test_defaults_are_those_of_a_cronjob() -> None:
    spec = AgentScheduleSpec.model_validate(SPEC)
    assert (spec.time_zone, spec.concurrency_policy, spec.suspend) == ("UTC", "Allow", False)
    assert (spec.successful_runs_history_limit, spec.failed_runs_history_limit) == (3, 1)
    assert spec.starting_deadline_seconds is None


def test_the_status_holds_what_the_operator_writes() -> None:
    status = {
        "observedGeneration": 2,
        "lastScheduleTime": "2026-11-24T12:31:00Z",
        "lastSuccessfulTime": "2026-11-24T12:30:00Z",
        "nextScheduleTime": "2026-11-24T12:32:00Z",
        "active": [{"name": "nightly-29400000", "uid": "u1"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "Scheduled", "message": "m"}],
    }
    dumped = AgentScheduleStatus.model_validate(status).model_dump(by_alias=True, exclude_none=True)
    assert dumped == status
