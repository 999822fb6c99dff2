"""An Agent offered over A2A (the Agent2Agent protocol): what its Agent Card says (spec.a2a).

Opt-in per Agent: `agentrun a2a` publishes a card and takes tasks only for Agents with expose set, so
applying an Agent never makes it reachable by accident. The card's text is written here rather than
derived from the system prompt, which may hold what callers should not read.
"""

from __future__ import annotations

from pydantic import Field

from agentrun.api.spec_base import SpecModel

SKILL_ID_PATTERN = r"^[a-zA-Z0-9_.-]{1,64}$"


class A2ASkill(SpecModel):
    """One skill of the Agent Card: what callers may ask for (descriptive: a task goes to the Agent)."""

    id: str = Field(pattern=SKILL_ID_PATTERN, description="Skill identifier, unique within the card.")
    name: str = Field(min_length=1, max_length=256, description="Skill name shown to callers.")
    description: str = Field(
        min_length=1, max_length=4096, description="What the skill does, for callers and their models."
    )
    tags: list[str] = Field(
        default_factory=list, max_length=32, description="Keywords callers may search skills by."
    )
    examples: list[str] = Field(
        default_factory=list, max_length=32, description="Example tasks that use this skill."
    )


class A2AExposure(SpecModel):
    """Whether and how `agentrun a2a` offers this Agent: its Agent Card, and tasks run as the caller."""

    expose: bool = Field(
        default=False,
        description=(
            "Offer this Agent over A2A: `agentrun a2a` publishes its Agent Card and turns each task sent to "
            "it into an AgentRun created as the caller (docs/a2a.md). Off unless set."
        ),
    )
    description: str | None = Field(
        default=None,
        max_length=4096,
        description="The Agent Card's description; defaults to a line naming the Agent.",
    )
    skills: list[A2ASkill] = Field(
        default_factory=list,
        max_length=64,
        description="The Agent Card's skills; one named after the Agent when empty (A2A needs one).",
    )
