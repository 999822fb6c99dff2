"""The AgentSchedule API: AgentRuns created from an Agent on a cron schedule, as a CronJob creates Jobs.

The CRD is generated from these models. runSpec reuses the AgentRun's own field definitions (bounds,
descriptions) for the fields a run with spec.agentRef may set, so a schedule can never declare a run the
AgentRun CRD would refuse for a reason this schema did not state.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import Field, JsonValue
from pydantic.fields import FieldInfo

from agentrun.api.model_spec import ModelSpec
from agentrun.api.output_spec import OutputSpec
from agentrun.api.spec import MAX_TASK_CHARS, AgentRef, Limits, RunDefinition
from agentrun.api.spec_base import SpecModel
from agentrun.api.status import StatusModel
from agentrun.api.tool_specs import ToolChoice

#: The runSpec fields: what a run with spec.agentRef may set besides task, cancel and approvals.
RUN_SPEC_FIELDS = ("model", "limits", "output", "tool_choice", "priority", "ttl_seconds_after_finished")


def _from_run(name: str) -> Any:
    """The AgentRun's field, optional here: left out, the run gets the Agent's value."""
    info: FieldInfo = copy.copy(RunDefinition.model_fields[name])
    info.default = None
    info.default_factory = None
    return info


class ScheduledRunSpec(SpecModel):
    """Fields copied into the spec of every run created (with agentRef and the rendered task)."""

    model: ModelSpec | None = _from_run("model")
    limits: Limits | None = _from_run("limits")
    output: OutputSpec | None = _from_run("output")
    tool_choice: ToolChoice | None = _from_run("tool_choice")
    priority: int | None = _from_run("priority")
    ttl_seconds_after_finished: int | None = _from_run("ttl_seconds_after_finished")


#: 5 fields or a macro, checked by the API server as far as CEL can; the operator checks the rest.
SCHEDULE_SHAPE: dict[str, JsonValue] = {
    "rule": r"self.startsWith('@') || self.matches('^\\s*\\S+(\\s+\\S+){4}\\s*$')",
    "message": "spec.schedule has 5 fields (minute hour day-of-month month day-of-week) or is a macro "
    "such as @hourly",
}


class AgentScheduleSpec(SpecModel):
    """When to create runs of an Agent, and with which task."""

    schedule: str = Field(
        min_length=1,
        max_length=256,
        json_schema_extra={"x-kubernetes-validations": [SCHEDULE_SHAPE]},
        description=(
            "Cron expression: 5 fields (minute hour day-of-month month day-of-week; names, ranges, "
            "lists and steps as in cron) or @yearly, @monthly, @weekly, @daily, @hourly."
        ),
    )
    time_zone: str = Field(
        default="UTC",
        min_length=1,
        max_length=64,
        description="IANA time zone the schedule is read in (e.g. Europe/Berlin).",
    )
    agent_ref: AgentRef = Field(description="The Agent every run is created from (same namespace).")
    task: str = Field(
        min_length=1,
        max_length=MAX_TASK_CHARS,
        description=(
            "Task of each run, a template: {{scheduledTime}} (RFC 3339, UTC), {{scheduleName}} and "
            "{{namespace}} are filled in; any other placeholder makes the schedule invalid."
        ),
    )
    run_spec: ScheduledRunSpec | None = Field(
        default=None,
        description=(
            "model, limits (tighten only), output, toolChoice, priority and ttlSecondsAfterFinished of "
            "each run, over the Agent's."
        ),
    )
    concurrency_policy: Literal["Allow", "Forbid", "Replace"] = Field(
        default="Allow",
        description=(
            "Allow: runs may overlap. Forbid: a time that comes while a run is unfinished is skipped. "
            "Replace: the unfinished runs are cancelled (spec.cancel) and the new one created."
        ),
    )
    starting_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description=(
            "A time missed (operator down) is started late only within this many seconds; unset: "
            "however late."
        ),
    )
    suspend: bool = Field(default=False, description="True: create no runs (times that pass are skipped).")
    successful_runs_history_limit: int = Field(
        default=3, ge=0, description="Succeeded runs kept; older ones are deleted."
    )
    failed_runs_history_limit: int = Field(
        default=1, ge=0, description="Failed or cancelled runs kept; older ones are deleted."
    )


class ActiveRun(StatusModel):
    """An unfinished run created by the schedule."""

    name: str = Field(description="Name of the AgentRun.")
    uid: str = Field(description="Its uid.")


class AgentScheduleStatus(StatusModel):
    """What the schedule did (operator-owned)."""

    observed_generation: int | None = Field(default=None, description="Spec generation last acted on.")
    last_schedule_time: str | None = Field(
        default=None,
        description=(
            "The latest scheduled time handled (RFC 3339): a run created, or a time skipped (Forbid, "
            "suspend, past the starting deadline)."
        ),
    )
    last_successful_time: str | None = Field(
        default=None, description="Scheduled time of the latest run that succeeded."
    )
    next_schedule_time: str | None = Field(default=None, description="The next time a run is due.")
    active: list[ActiveRun] = Field(default_factory=list, description="Unfinished runs of the schedule.")
    conditions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Ready (the spec is valid and the schedule is served) and MissedSchedules.",
    )
