"""The agent tool kind: each call runs a child AgentRun from an Agent and answers with its result.

The tool decides what a child may spend and words the child's outcome for the model; creating the
child and waiting for it is the controller's (ChildRuns), since only the operator may create runs.
A child is named from the parent's uid and the tool_use id, so a call repeated after a restart
finds its child instead of starting a second one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, Decimal
from typing import Any, Protocol

from agentrun.api.spec import Limits
from agentrun.api.tool_specs import AgentTool as AgentToolSpec
from agentrun.api.usage import TokenUsage
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import CallBudget, ToolCall, ToolDefinition, ToolOutput

CENT_FRACTION = Decimal("0.000001")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

INPUT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "description": "The complete task for the sub-agent: it sees nothing of this conversation.",
        }
    },
    "required": ["task"],
}


def child_name(parent_name: str, parent_uid: str, tool_use_id: str) -> str:
    """The same name for the same call, whoever asks and however often."""
    digest = hashlib.sha256(f"{parent_uid}/{tool_use_id}".encode()).hexdigest()[:10]
    return f"{parent_name[:40]}-{digest}"


def tool_use_label(tool_use_id: str) -> str:
    """The tool_use id as a label value; ids that are not valid label values are hashed."""
    if len(tool_use_id) <= 63 and _LABEL_VALUE.match(tool_use_id):
        return tool_use_id
    return hashlib.sha256(tool_use_id.encode()).hexdigest()[:40]


def carve(agent_limits: Mapping[str, Any], budget: CallBudget) -> dict[str, Any]:
    """The child's limits: the Agent's, cut to this call's share of what the parent has left.

    Raises ToolError budget_exhausted when the share of some resource is nothing: a child that
    could not make one request would only fail later, having cost a run.
    """
    agent = Limits.model_validate(dict(agent_limits))
    siblings = max(budget.siblings, 1)
    carved: dict[str, Any] = {}
    if budget.tokens is not None:
        if budget.tokens <= 0:
            raise _exhausted("tokens", "0 tokens")
        share = max(budget.tokens // siblings, 1)
        carved["tokenBudget"] = share if agent.token_budget is None else min(agent.token_budget, share)
    elif agent.token_budget is not None:
        carved["tokenBudget"] = agent.token_budget
    if budget.cost_usd is not None:
        dollars = (budget.cost_usd / siblings).quantize(CENT_FRACTION, rounding=ROUND_DOWN)
        if dollars <= 0:
            raise _exhausted("dollars", f"${budget.cost_usd}")
        if agent.cost_budget_usd is not None:
            dollars = min(Decimal(str(agent.cost_budget_usd)), dollars)
        carved["costBudgetUSD"] = float(dollars)
    elif agent.cost_budget_usd is not None:
        carved["costBudgetUSD"] = agent.cost_budget_usd
    seconds = agent.timeout_seconds
    if budget.seconds is not None:
        share_seconds = math.floor(budget.seconds / siblings)
        if share_seconds < 1:
            raise _exhausted("time", f"{budget.seconds:.1f}s")
        seconds = min(seconds, share_seconds)
    carved["timeoutSeconds"] = seconds
    return carved


def _exhausted(resource: str, left: str) -> ToolError:
    return ToolError(
        "budget_exhausted",
        f"the run has too little {resource} left ({left}) to start a sub-agent",
        hint="answer with what you have",
        recoverable=True,
    )


@dataclass(frozen=True)
class ChildRequest:
    tool: str  # the tool's name, as the model called it
    agent: str  # the Agent the child runs
    task: str
    tool_use_id: str
    budget: CallBudget


@dataclass(frozen=True)
class ChildResult:
    """A finished child, as its status shows it."""

    name: str
    phase: str
    stop_reason: str | None
    message: str | None
    result: str | None
    output: Any = None
    has_output: bool = False
    usage_by_model: Mapping[str, TokenUsage] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded"


class ChildRuns(Protocol):
    """The operator's side: create (or find) the child of one call and wait until it finishes.

    Raises ToolError (depth_limit, budget_exhausted, agent_not_found) when no child is started.
    """

    async def run(self, request: ChildRequest) -> ChildResult: ...


@dataclass
class AgentTool:
    spec: AgentToolSpec
    children: ChildRuns
    definition: ToolDefinition = field(init=False)

    def __post_init__(self) -> None:
        self.definition = ToolDefinition(
            self.spec.name,
            self.spec.description,
            INPUT_SCHEMA,
            spawns_runs=True,
            timeout_seconds=math.inf,  # bounded by the child's own timeout and the parent's deadline
        )

    async def call(self, call: ToolCall) -> ToolOutput:
        task = call.input.get("task")
        if not isinstance(task, str) or not task.strip():
            raise ToolError(
                "invalid_input", "input.task must be a non-empty string", hint="describe the task in full"
            )
        request = ChildRequest(self.spec.name, self.spec.agent_ref.name, task, call.id, call.budget)
        child = await self.children.run(request)
        return answer(child)


def answer(child: ChildResult) -> ToolOutput:
    """The child's output (JSON) or result text; a failed child is an error naming its stop reason."""
    if not child.succeeded:
        payload = {
            "code": "child_failed",
            "child": child.name,
            "stopReason": child.stop_reason or child.phase,
            "message": child.message or "",
        }
        return ToolOutput(
            json.dumps(payload), is_error=True, structured=payload, usage_by_model=child.usage_by_model
        )
    content = json.dumps(child.output, sort_keys=True) if child.has_output else child.result or ""
    return ToolOutput(content, usage_by_model=child.usage_by_model)
