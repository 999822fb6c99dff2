"""The AgentRun spec: what a platform team declares.

The CRD's openAPIV3Schema is generated from these models (``agentrun crd``), so every constraint
written here is enforced twice: by the API server at admission and by pydantic when the operator
(or ``agentrun run``) reads a manifest. Field descriptions become ``kubectl explain`` text.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator

from agentrun.api.context_spec import ContextSpec
from agentrun.api.model_spec import THINKING_TOOL_CHOICE, ModelSpec
from agentrun.api.output_spec import OutputSpec
from agentrun.api.provider_spec import SERVER_COMPACTION_PROVIDER
from agentrun.api.sandbox_spec import SANDBOX_TOOL_NAMES, SandboxDeclaration, SandboxSpec
from agentrun.api.spec_base import DNS_LABEL_PATTERN, SpecModel, ToolName
from agentrun.api.tool_specs import ToolChoice, ToolSpec

MAX_TASK_CHARS = 262_144


class LoopDetection(SpecModel):
    """Stops runs that repeat themselves instead of making progress."""

    enabled: bool = Field(default=True, description="Whether loop detection is active.")
    repeats: int = Field(
        default=3,
        ge=2,
        le=100,
        description=(
            "Tool turns in a row without progress that end the run: the same call (tool and input) in "
            "each, the same whole turn (every call and result) repeated, or a cycle of up to 4 turns "
            "gone round at least twice. Equal results of different calls are never a loop."
        ),
    )
    failures_per_tool: int = Field(
        default=5,
        ge=2,
        le=100,
        description=(
            "Tool turns in a row in which every call of one tool failed, whatever its input, "
            "that end the run."
        ),
    )


class Limits(SpecModel):
    """Termination limits; several overlap on purpose and all are checked before each model request."""

    max_iterations: int = Field(
        default=20,
        ge=1,
        le=10_000,
        description="Maximum model requests that may request tools; then one final tools-off answer turn.",
    )
    token_budget: int | None = Field(
        default=None,
        ge=1,
        description="Maximum input + output + cache-creation + cache-read tokens for the whole run.",
    )
    cost_budget_usd: float | None = Field(
        default=None,
        alias="costBudgetUSD",
        gt=0,
        description="Maximum spend in US dollars, priced by the operator's price table.",
    )
    timeout_seconds: int = Field(
        default=1800,
        ge=1,
        le=7 * 24 * 3600,
        description="Wall-clock limit for the run; in-flight model and tool calls are cancelled.",
    )
    tool_concurrency: int = Field(default=8, ge=1, le=64, description="Parallel tool calls per turn.")
    tool_timeout_seconds: int = Field(default=120, ge=1, le=3600, description="Per tool call timeout.")
    max_tool_result_chars: int = Field(
        default=20_000,
        ge=100,
        le=1_000_000,
        description="Tool results longer than this are cut, with a marker saying how much was cut.",
    )
    max_consecutive_tool_errors: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="Turns in a row in which every tool call failed before the run stops.",
    )
    loop_detection: LoopDetection = Field(
        default_factory=LoopDetection,
        description="Repetition detection settings.",
    )
    approval_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 24 * 3600,
        description=(
            "How long a call of a tool with requiresApproval waits for a decision in spec.approvals; "
            "then it is denied with reason 'approval timed out'. Defaults to the operator's "
            "AGENTRUN_APPROVAL_TIMEOUT_SECONDS. timeoutSeconds and cancel still apply while waiting."
        ),
    )


class Approval(SpecModel):
    """A human decision on a tool call that requires approval."""

    tool_use_id: str = Field(min_length=1, max_length=256, description="The call.")
    decision: Literal["approve", "deny"] = Field(description="approve or deny.")
    by: str = Field(min_length=1, max_length=256, description="Who decided.")
    reason: str | None = Field(default=None, max_length=4096, description="Why (shown to the model).")


#: Recorded decisions are evidence: an update may only add entries after them. Linear in the list
#: (a pairwise check blows the API server's runtime cost budget on long lists), with a two-variable
#: comprehension: CEL library of Kubernetes 1.32, so API servers from 1.33 accept the rule (`slice`
#: would need 1.35). The list rule is a transition rule, skipped when the new spec has no approvals
#: at all; the spec-level rule closes that gap (removing the whole list).
APPROVALS_APPEND_ONLY: dict[str, JsonValue] = {
    "rule": "size(self) >= size(oldSelf) && oldSelf.all(i, recorded, self[i] == recorded)",
    "message": "spec.approvals is append-only: recorded decisions cannot be changed, reordered or removed",
}
APPROVALS_KEPT: dict[str, JsonValue] = {
    "rule": "!has(oldSelf.approvals) || size(oldSelf.approvals) == 0 || has(self.approvals)",
    "message": "spec.approvals is append-only: the recorded decisions cannot be removed",
}

IMMUTABLE_SPEC_FIELDS = (
    "task",
    "agentRef",
    "systemPrompt",
    "model",
    "tools",
    "toolChoice",
    "requiredTools",
    "limits",
    "serviceAccountName",
    "output",
    "context",
    "sandbox",
)


#: What an Agent decides alone: a run created from it (spec.agentRef) cannot set these.
AGENT_OWNED_FIELDS = ("systemPrompt", "tools", "requiredTools", "serviceAccountName", "context", "sandbox")

AGENT_OWNED: list[JsonValue] = [
    {
        "rule": f"!has(self.agentRef) || !has(self.{name})",
        "message": f"spec.{name} comes from the Agent (spec.agentRef); a run cannot set it",
    }
    for name in AGENT_OWNED_FIELDS
]

#: A warm pool is kept by an Agent for its runs; a run of its own has no pool to keep or take from.
WARM_POOL_ON_AGENTS: dict[str, JsonValue] = {
    "rule": "!has(self.sandbox) || !has(self.sandbox.warmPool) || self.sandbox.warmPool == 0",
    "message": (
        "spec.sandbox.warmPool is kept by an Agent for its runs; set it on the Agent, not on an AgentRun"
    ),
}


class AgentRef(SpecModel):
    """An Agent in the run's own namespace."""

    name: str = Field(
        min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN, description="Name of the Agent."
    )


class RunDefinition(SpecModel):
    """What a run does, apart from its task: shared by AgentRun.spec and Agent.spec."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [THINKING_TOOL_CHOICE, SERVER_COMPACTION_PROVIDER]}
    )

    system_prompt: str | None = Field(
        default=None,
        max_length=MAX_TASK_CHARS,
        description="System prompt; together with the tool list it forms the cached prompt prefix.",
    )
    model: ModelSpec = Field(default_factory=ModelSpec, description="Model settings.")
    tools: list[ToolSpec] = Field(
        default_factory=list, max_length=128, description="Tools the agent may call."
    )
    tool_choice: ToolChoice | None = Field(
        default=None,
        description="Tool choice for the first model request (e.g. force a tool); later turns are auto.",
    )
    required_tools: list[ToolName] = Field(
        default_factory=list,
        max_length=64,
        description="Tools that must have run successfully before an end_turn is accepted.",
    )
    limits: Limits = Field(default_factory=Limits, description="Termination limits and budgets.")
    context: ContextSpec = Field(
        default_factory=ContextSpec,
        description="Context management for long runs: clearing old tool results and compaction.",
    )
    output: OutputSpec | None = Field(
        default=None,
        description=(
            "Structured answer: the final answer must be JSON valid against output.schema; "
            "it is then in status.output. Free text when unset."
        ),
    )
    service_account_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=253,
        description=(
            "ServiceAccount (in the run's namespace) that Kubernetes tools impersonate and that creates "
            "and execs into the run's sandbox pod."
        ),
    )
    sandbox: SandboxDeclaration | None = Field(
        default=None,
        description=(
            "A pod of the run's own where the model's bash and str_replace_based_edit_tool act "
            "(docs/sandbox.md), declared here or taken from a SandboxTemplate (templateRef). Created "
            "when the run first needs it, deleted when the run ends."
        ),
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description=(
            "Order among the waiting runs of the namespace: higher goes first, for a quota's room and "
            "for a slot of the operator. May be changed while the run waits."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the AgentRun this many seconds after it finished.",
    )

    @model_validator(mode="after")
    def _thinking_lets_the_model_choose(self) -> RunDefinition:
        choice = self.tool_choice
        if self.model.thinking is not None and choice is not None and choice.type in ("any", "tool"):
            raise ValueError(
                f"toolChoice.type {choice.type} forces a tool call, which the API refuses with "
                "model.thinking; use auto or none"
            )
        return self

    @model_validator(mode="after")
    def _server_compaction_on_anthropic(self) -> RunDefinition:
        compaction = self.context.compaction
        if self.model.provider != "anthropic" and compaction.enabled and compaction.strategy == "Server":
            raise ValueError(
                "context.compaction.strategy Server needs Anthropic's API (its compaction beta); "
                f"{self.model.provider} does not offer it: use strategy Client"
            )
        return self

    def tool_names(self) -> list[str]:
        """Names of non-MCP tools as the model sees them (MCP names are known only after listing)."""
        names: list[str] = []
        for tool in self.tools:
            if tool.builtin is not None:
                names.append(tool.builtin.name)
            elif tool.http is not None:
                names.append(tool.http.name)
        if self.sandbox is not None:
            names += list(SANDBOX_TOOL_NAMES)
        return names


class AgentRunSpec(RunDefinition):
    """The desired run. Immutable once created, except cancel, approvals and ttlSecondsAfterFinished."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                APPROVALS_KEPT,
                THINKING_TOOL_CHOICE,
                SERVER_COMPACTION_PROVIDER,
                *AGENT_OWNED,
                WARM_POOL_ON_AGENTS,
            ]
        }
    )

    task: str = Field(
        min_length=1,
        max_length=MAX_TASK_CHARS,
        description="The task given to the agent as the first user message.",
    )
    agent_ref: AgentRef | None = Field(
        default=None,
        description=(
            "Run this Agent (same namespace): its spec is the run's, overridden by the model, limits "
            "(tighten only), output, toolChoice, priority and ttlSecondsAfterFinished set here. "
            "systemPrompt, tools, requiredTools, serviceAccountName and context come from the Agent."
        ),
    )
    cancel: bool = Field(default=False, description="Set to true to stop the run (phase Cancelled).")
    approvals: list[Approval] = Field(
        default_factory=list,
        max_length=1024,
        description=(
            "Decisions on calls awaiting approval (status.pendingApprovals), appended by people or "
            "`kubectl agentrun approve|deny`. Append-only: recorded entries never change, move or "
            "disappear. The first decision for a toolUseId counts."
        ),
        json_schema_extra={"x-kubernetes-validations": [APPROVALS_APPEND_ONLY]},
    )

    @model_validator(mode="after")
    def _agent_owns_its_definition(self) -> AgentRunSpec:
        if self.agent_ref is not None:
            declared = {type(self).model_fields[name].alias for name in self.model_fields_set}
            for name in AGENT_OWNED_FIELDS:
                if name in declared:
                    raise ValueError(f"spec.{name} comes from the Agent (spec.agentRef); a run cannot set it")
        return self


class ResolvedRunSpec(AgentRunSpec):
    """The spec a run executes: its Agent merged in (spec.agentRef) and its sandbox complete, its
    SandboxTemplate read (spec.sandbox.templateRef).

    Why a type of its own: the tools and quota admission take this one, so mypy proves that nothing
    which starts a pod or counts its CPU and memory sees a sandbox whose template was not read.
    """

    sandbox: SandboxSpec | None = Field(default=None, description="The run's sandbox, resolved.")

    @classmethod
    def of(cls, spec: AgentRunSpec, sandbox: SandboxSpec | None) -> ResolvedRunSpec:
        """``spec`` with ``sandbox`` in place of its declaration; what each declared stays declared."""
        fields = spec.model_dump(by_alias=True, exclude_unset=True, exclude={"sandbox"})
        if sandbox is not None:
            fields["sandbox"] = sandbox.model_dump(by_alias=True, exclude_unset=True)
        return cls.model_validate(fields)
