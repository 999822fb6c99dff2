"""The Agent: a run's definition without its task, kept once and run many times (spec.agentRef).

Its spec is AgentRun.spec's definition part (spec.RunDefinition), so both are validated by the same
models; a run started from an Agent records the Agent's spec in its status and never reads it again.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentrun.api.spec import RunDefinition
from agentrun.api.status import Condition


class AgentSpec(RunDefinition):
    """What every run of this Agent does; a run adds the task and may narrow the limits."""


class AgentStatus(BaseModel):
    """What the operator saw of the Agent."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    observed_generation: int | None = Field(default=None, description="Spec generation last validated.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Ready: True (reason Valid) when a run of the Agent would be admitted as it stands; False "
            "(reason InvalidSpec) names every field a run of it would be refused for."
        ),
    )
