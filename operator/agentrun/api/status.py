"""The AgentRun status: what happened, written by the operator only.

Every field stored in status must be declared here: the API server prunes undeclared status
fields silently. Kopf's own bookkeeping lives under ``status.kopf`` (declared open-ended).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from agentrun.api.phases import FINISHED_PHASES as FINISHED_PHASES
from agentrun.api.phases import Phase as Phase


class StatusModel(BaseModel):
    """What every status model shares, of AgentRuns, Agents, schedules and quotas: camelCase like the
    spec (alias generator), explicit aliases only for initialisms (costUSD); fields it does not know
    are ignored, not refused (status is the operator's own, and an older operator may read a newer's)."""

    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True)


class Usage(StatusModel):
    """Token usage and spend; cache tokens are reported separately, as the API reports them."""

    input_tokens: int = Field(default=0, description="Uncached input tokens.")
    output_tokens: int = Field(default=0, description="Output tokens.")
    cache_creation_input_tokens: int = Field(default=0, description="Input tokens written to the cache.")
    cache_read_input_tokens: int = Field(default=0, description="Input tokens read from the cache.")
    total_tokens: int = Field(
        default=0,
        description="input + output + cache creation + cache read: what tokenBudget is checked against.",
    )
    cost_usd: str | None = Field(
        default=None,
        alias="costUSD",
        description="Spend in US dollars as a decimal string; unset when the model's price is unknown.",
    )
    unpriced_models: list[str] = Field(
        default_factory=list,
        description="Models used by the run that have no price in the price table (cost not guessed).",
    )


class Condition(StatusModel):
    """A Kubernetes API convention condition."""

    type: str = Field(description="Condition type: Succeeded, Ready, Reconciling or Stalled.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="Spec generation this condition reflects."
    )


class TranscriptRef(StatusModel):
    """Where the run's full conversation and trace are stored."""

    kind: str = Field(
        description="Where the transcript is kept: Secret or ConfigMap (chunk objects), or postgres (rows)."
    )
    name_prefix: str = Field(description="Objects are named <prefix>-<chunk>.")
    chunks: int = Field(default=0, description="Number of chunks written.")
    bytes: int = Field(default=0, description="Compressed bytes stored.")


class PendingApproval(StatusModel):
    """A tool call waiting for a human decision in spec.approvals."""

    tool_use_id: str = Field(description="The tool_use id to approve or deny.")
    tool_name: str = Field(description="Tool name.")
    input: dict[str, Any] = Field(
        default_factory=dict,
        description="The call's input.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    since: str = Field(description="When the run started waiting (RFC 3339).")


class ContextStatus(StatusModel):
    """Context management so far: compactions, and the request sizes around the latest one."""

    compactions: int = Field(default=0, description="Compactions of the conversation so far.")
    last_compaction_iteration: int | None = Field(
        default=None, description="The iteration after which the latest compaction happened."
    )
    tokens_before: int | None = Field(
        default=None, description="Estimated input tokens of the next request before the latest compaction."
    )
    tokens_after: int | None = Field(
        default=None, description="Estimated input tokens of the next request after the latest compaction."
    )
    tokens_removed: int = Field(
        default=0, description="Estimated input tokens all compactions removed from the next request."
    )


class QuotaLimits(StatusModel):
    """Limits an AgentRunQuota imposed on the run at admission, so a resumed run keeps them."""

    token_budget: int | None = Field(default=None, description="The run's tokenBudget.")
    cost_budget_usd: float | None = Field(
        default=None, alias="costBudgetUSD", description="The run's costBudgetUSD (US dollars)."
    )
    max_iterations: int | None = Field(default=None, description="The run's maxIterations.")
    timeout_seconds: int | None = Field(default=None, description="The run's timeoutSeconds.")


class QuotaWait(StatusModel):
    """What holds a run Pending for quota: read by the other replicas to keep one line per namespace."""

    quota: str = Field(description="The AgentRunQuota that is full; empty when runs ahead of it wait.")
    limit: str = Field(
        description=(
            "The limit that is full (concurrentRuns, runs, tokens, costUSD, concurrentSandboxes, "
            "sandboxCPU, sandboxMemory), or order: runs ahead of it in the namespace's line wait for "
            "room it needs too."
        )
    )


class AgentUsed(StatusModel):
    """The Agent a run (spec.agentRef) was resolved from, as it was then."""

    name: str = Field(description="The Agent's name.")
    uid: str = Field(description="Its uid: a deleted and recreated Agent of that name is another one.")
    generation: int | None = Field(default=None, description="Its metadata.generation when the run read it.")


class TemplateUsed(StatusModel):
    """The SandboxTemplate a run's sandbox (spec.sandbox.templateRef) was resolved from, as it was then."""

    name: str = Field(description="The SandboxTemplate's name.")
    uid: str = Field(description="Its uid: a deleted and recreated template of that name is another one.")
    generation: int | None = Field(default=None, description="Its metadata.generation when the run read it.")


class AwaitingChild(StatusModel):
    """A call of a descendant run waiting for a human decision (spec.approvals on that run)."""

    run: str = Field(description="The child (or deeper descendant) run that waits.")
    tool_use_id: str = Field(description="The tool_use id to approve or deny on that run.")
    tool: str = Field(description="The tool it wants to call.")


class ChildrenStatus(StatusModel):
    """The child runs the agent tools of this run started, summed up."""

    total: int = Field(default=0, description="Children started so far.")
    active: int = Field(default=0, description="Children not finished yet.")
    succeeded: int = Field(default=0, description="Children that succeeded.")
    failed: int = Field(default=0, description="Children that failed or were cancelled.")
    tokens: int = Field(default=0, description="Tokens the children used (also in status.usage).")
    cost_usd: str | None = Field(
        default=None,
        alias="costUSD",
        description="Dollars the children spent (also in status.usage); unset when a model has no price.",
    )
    awaiting_approval: list[AwaitingChild] = Field(
        default_factory=list,
        description="Calls of children that wait for an approval: approve them on the child run.",
    )


class AgentRunStatus(StatusModel):
    """Observed state of the run."""

    phase: Phase | None = Field(default=None, description="Pending, Running, AwaitingApproval or final.")
    stop_reason: str | None = Field(
        default=None, description="Why the run stopped (CamelCase), once finished."
    )
    raw_stop_reason: str | None = Field(
        default=None,
        description="The model's stop_reason verbatim when the operator did not recognise it.",
    )
    message: str | None = Field(default=None, description="Human-readable summary of the current state.")
    iterations: int = Field(default=0, description="Model requests made so far.")
    tool_calls: int = Field(default=0, description="Tool calls executed so far.")
    usage: Usage = Field(default_factory=Usage, description="Token usage and spend.")
    result: str | None = Field(
        default=None, description="The final answer, cut to 32 KiB; the transcript holds everything."
    )
    result_truncated: bool | None = Field(default=None, description="True when result was cut to fit.")
    output: Any = Field(
        default=None,
        description=(
            "The final answer as JSON, valid against spec.output.schema (any JSON value; object "
            "members that are null are absent, as a merge patch drops them). Left out when larger "
            "than 32 KiB as JSON: see outputOmitted."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    output_omitted: bool | None = Field(
        default=None,
        description="True when output was larger than 32 KiB as JSON; the transcript holds it whole.",
    )
    start_time: str | None = Field(default=None, description="When the loop started.")
    completion_time: str | None = Field(default=None, description="When the run finished.")
    observed_generation: int | None = Field(default=None, description="Spec generation last acted upon.")
    transcript: TranscriptRef | None = Field(default=None, description="Reference to the stored transcript.")
    context: ContextStatus | None = Field(
        default=None, description="Context management (spec.context): set once the run compacts."
    )
    pending_approvals: list[PendingApproval] = Field(
        default_factory=list, description="Tool calls awaiting a decision."
    )
    quota_limits: QuotaLimits | None = Field(
        default=None,
        description=(
            "The limits of spec.limits as the namespace's AgentRunQuotas set them at admission "
            "(a quota's perRun default for a limit the run left out); unset without quotas."
        ),
    )
    agent: AgentUsed | None = Field(
        default=None, description="With spec.agentRef: the Agent the run was resolved from."
    )
    agent_spec: dict[str, Any] | None = Field(
        default=None,
        description=(
            "With spec.agentRef: the Agent's spec as the run read it, once; the run keeps using it "
            "when the Agent changes later."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    sandbox_template: TemplateUsed | None = Field(
        default=None,
        description="With spec.sandbox.templateRef: the SandboxTemplate the run's sandbox was resolved from.",
    )
    sandbox_template_spec: dict[str, Any] | None = Field(
        default=None,
        description=(
            "With spec.sandbox.templateRef: the SandboxTemplate's spec as the run read it, once; the run "
            "keeps using it when the template changes or goes later."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    children: ChildrenStatus | None = Field(
        default=None,
        description="The child runs of the run's agent tools (see docs/agents.md, 'Sub-agents').",
    )
    queue_position: int | None = Field(
        default=None,
        description=(
            "While Pending for a run slot (reason Queued): the run's place in the operator's queue, 1 = "
            "next. Slots go to namespaces in turn, and within a namespace by spec.priority, then age. "
            "Updated at most every AGENTRUN_STATUS_INTERVAL_SECONDS; cleared when the run starts."
        ),
    )
    quota_wait: QuotaWait | None = Field(
        default=None,
        description=(
            "While Pending for quota (reason QuotaExceeded): the quota and limit that hold the run back. "
            "Every operator replica reads it, so the runs of a namespace are admitted in one order "
            "across replicas. Cleared when the run leaves the quota's line."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Succeeded, plus the kstatus trio Ready / Reconciling / Stalled.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    kopf: dict[str, Any] = Field(
        default_factory=dict,
        description="Bookkeeping of the Kopf framework; not part of the API.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
