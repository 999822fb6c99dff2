"""The Agent: a run's definition without its task, kept once and run many times (spec.agentRef).

Its spec is AgentRun.spec's definition part (spec.RunDefinition), so both are validated by the same
models; a run started from an Agent records the Agent's spec in its status and never reads it again.
"""

from __future__ import annotations

from pydantic import Field

from agentrun.api.spec import RunDefinition
from agentrun.api.status import Condition, StatusModel


class AgentSpec(RunDefinition):
    """What every run of this Agent does; a run adds the task and may narrow the limits."""


class AgentStatus(StatusModel):
    """What the operator saw of the Agent."""

    observed_generation: int | None = Field(default=None, description="Spec generation last validated.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Ready: True (reason Valid) when a run of the Agent would be admitted as it stands; False "
            "(reason InvalidSpec) names every field a run of it would be refused for."
        ),
    )
