"""What an Agent's status should say: its spec checked exactly as a run of it would be admitted.

The check is the run's own parse and validation (controller/agentruns/phases.py) on the Agent's spec
with a task, i.e. the effective spec of a run that sets nothing but agentRef and task: the verdict and
the message are the ones such a run would end with, never a second set of rules that could drift from
the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun.api.agent import AGENT_ONLY_FIELDS, AgentStatus, WarmPoolStatus
from agentrun.api.conditions import INVALID_SPEC, condition
from agentrun.api.status import Condition
from agentrun.controller.agentruns.phases import Ending, read_spec
from agentrun.kube.objects import ObjectMeta

__all__ = ["INVALID_SPEC", "VALID", "VALID_MESSAGE", "agent_status", "check"]

VALID = "Valid"
VALID_MESSAGE = "runs of this Agent are admitted"
#: Stands in for the task: an Agent has none, and every run of it brings its own.
_TASK = "(the run's task)"


def check(spec: Mapping[str, Any]) -> str | None:
    """None when a run of the Agent would be admitted; else one line naming every field that is wrong."""
    run_part = {key: value for key, value in spec.items() if key not in AGENT_ONLY_FIELDS}
    read = read_spec({**run_part, "task": _TASK})
    return read.outcome.message if isinstance(read, Ending) else None


def agent_status(body: Mapping[str, Any], now: str, pool: WarmPoolStatus | None = None) -> AgentStatus:
    """The status the Agent should have: observedGeneration, the Ready condition and its warm pool.

    lastTransitionTime stays what it was while Ready keeps its status, so a rewrite for a new
    generation with the same verdict does not pretend the Agent just became (in)valid.
    """
    generation = ObjectMeta.of(body).generation
    problem = check(body.get("spec") or {})
    status, reason, message = (
        ("True", VALID, VALID_MESSAGE) if problem is None else ("False", INVALID_SPEC, problem)
    )
    previous = (body.get("status") or {}).get("conditions") or []
    ready = condition("Ready", status, reason, message, now=now, previous=previous, generation=generation)
    return AgentStatus(
        observed_generation=generation, conditions=[Condition.model_validate(ready)], warm_pool=pool
    )
