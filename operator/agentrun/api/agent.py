"""The Agent: a run's definition without its task, kept once and run many times (spec.agentRef).

Its spec is AgentRun.spec's definition part (spec.RunDefinition), so both are validated by the same
models; a run started from an Agent records the Agent's spec in its status and never reads it again.
"""

from __future__ import annotations

from pydantic import Field

from agentrun.api.a2a_spec import A2AExposure
from agentrun.api.spec import RunDefinition
from agentrun.api.status import Condition, StatusModel

#: Fields of an Agent's spec that are about the Agent, not its runs: a run of it never carries them.
AGENT_ONLY_FIELDS = ("a2a",)


class AgentSpec(RunDefinition):
    """What every run of this Agent does; a run adds the task and may narrow the limits."""

    a2a: A2AExposure | None = Field(
        default=None,
        alias="a2a",
        description="Offer this Agent over the A2A protocol (`agentrun a2a`, docs/a2a.md); off when unset.",
    )


class WarmPoolStatus(StatusModel):
    """The Agent's warm sandbox pool as its last refill found it (docs/sandbox.md, Fast start)."""

    size: int = Field(description="spec.sandbox.warmPool: the pods the pool is kept at.")
    ready: int = Field(description="Unclaimed pool pods whose sandbox container runs, ready for a run.")
    message: str | None = Field(
        default=None,
        description="Why the pool cannot be filled (a missing right, a refused pod); unset when it can.",
    )


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
    warm_pool: WarmPoolStatus | None = Field(
        default=None, description="The warm sandbox pool, when spec.sandbox.warmPool was ever set."
    )
