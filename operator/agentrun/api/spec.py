"""The AgentRun spec: what a platform team declares.

The CRD's openAPIV3Schema is generated from these models (``agentrun crd``), so every constraint
written here is enforced twice: by the API server at admission and by pydantic when the operator
(or ``agentrun run``) reads a manifest. Field descriptions become ``kubectl explain`` text.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Annotated, Any, Literal

import jsonschema
import jsonschema.protocols
import referencing.jsonschema
from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.alias_generators import to_camel

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_TASK_CHARS = 262_144

ToolName = Annotated[str, Field(pattern=TOOL_NAME_PATTERN, min_length=1, max_length=64)]


class _Model(BaseModel):
    """Strict camelCase models: unknown fields are errors, not silently ignored.

    Field names are camel-cased for the API by the alias generator; an explicit alias is only
    for an initialism the generator would not spell as the API does (baseURL, costBudgetUSD).
    """

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class SecretKeyRef(_Model):
    """A key of a Secret in the run's own namespace (cross-namespace references are not allowed)."""

    name: str = Field(
        description="Name of the Secret, in the same namespace as the AgentRun.",
        min_length=1,
        max_length=253,
    )
    key: str = Field(
        default="api-key",
        description="Key inside the Secret's data whose value is used.",
        min_length=1,
        max_length=253,
    )


#: The smallest thinking budget the Messages API accepts.
MIN_THINKING_BUDGET = 1024
DEFAULT_MAX_TOKENS = 4096


class ThinkingSpec(_Model):
    """Extended thinking: the model reasons in thinking blocks before it answers or calls a tool."""

    budget_tokens: int = Field(
        ge=MIN_THINKING_BUDGET,
        le=128_000,
        description=(
            "Tokens the model may spend thinking per request (the API's thinking.budget_tokens): at "
            "least 1024 and less than maxTokens, because thinking counts toward maxTokens and toward "
            "the output tokens of usage, budgets and cost."
        ),
    )
    interleaved: bool = Field(
        default=True,
        description=(
            "Let the model think again after each tool result (the API's interleaved-thinking beta, "
            "sent when the run has tools). Turn it off for a model or a Messages-API-compatible "
            "server that does not accept the beta; the model then thinks once per turn."
        ),
    )


#: Combinations the Messages API refuses; the CRD says so at admission, pydantic in the admit phase.
THINKING_WITHIN_MAX_TOKENS: dict[str, JsonValue] = {
    "rule": f"!has(self.thinking) || self.thinking.budgetTokens < "
    f"(has(self.maxTokens) ? self.maxTokens : {DEFAULT_MAX_TOKENS})",
    "message": "model.thinking.budgetTokens must be less than model.maxTokens "
    "(thinking counts toward maxTokens)",
    "fieldPath": ".thinking.budgetTokens",
}
THINKING_TEMPERATURE: dict[str, JsonValue] = {
    "rule": "!has(self.thinking) || !has(self.temperature) || self.temperature == 1.0",
    "message": "model.temperature must be unset or 1 with model.thinking "
    "(the API refuses other temperatures when thinking is on)",
    "fieldPath": ".temperature",
}
THINKING_TOOL_CHOICE: dict[str, JsonValue] = {
    "rule": "!has(self.model) || !has(self.model.thinking) || !has(self.toolChoice) || "
    "self.toolChoice.type == 'auto' || self.toolChoice.type == 'none'",
    "message": "toolChoice.type any or tool forces a tool call, which the API refuses with "
    "model.thinking; use auto or none",
    "fieldPath": ".toolChoice.type",
}


class ModelSpec(_Model):
    """Which Anthropic model to call and how."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [THINKING_WITHIN_MAX_TOKENS, THINKING_TEMPERATURE]}
    )

    name: str = Field(
        default="claude-sonnet-4-6",
        description="Model name passed to the Messages API, e.g. claude-sonnet-4-6.",
        min_length=1,
        max_length=128,
    )
    max_tokens: int = Field(
        default=DEFAULT_MAX_TOKENS,
        ge=1,
        le=128_000,
        description="Upper bound on output tokens per model request (the API's max_tokens).",
    )
    temperature: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Sampling temperature; omitted from requests when unset (the API default applies).",
    )
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Strings that stop generation. When one of these fires and it is not listed in "
            "finishSequences, the output is treated as drift: discarded and the model re-prompted."
        ),
    )
    finish_sequences: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Stop strings that mean a clean finish: the run ends with the text before the sequence "
            "as its result. They are sent to the API together with stopSequences."
        ),
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "Secret holding the Anthropic API key for this run. When unset the operator's own "
            "ANTHROPIC_API_KEY is used. The key never appears in status, events, logs or metrics."
        ),
    )
    base_url: str | None = Field(
        default=None,
        alias="baseURL",
        max_length=2048,
        pattern=r"^https?://",
        description="Messages API base URL; defaults to the operator's ANTHROPIC_BASE_URL or Anthropic's.",
    )
    thinking: ThinkingSpec | None = Field(
        default=None,
        description=(
            "Extended thinking; off when unset. Thinking blocks are sent back unchanged in the "
            "following requests, as the API requires. The API refuses it with a temperature other "
            "than 1 and with a toolChoice that forces a tool."
        ),
    )

    @model_validator(mode="after")
    def _thinking_fits(self) -> ModelSpec:
        if self.thinking is None:
            return self
        if self.thinking.budget_tokens >= self.max_tokens:
            raise ValueError(
                f"model.thinking.budgetTokens ({self.thinking.budget_tokens}) must be less than "
                f"model.maxTokens ({self.max_tokens}): thinking counts toward maxTokens"
            )
        if self.temperature is not None and self.temperature != 1.0:
            raise ValueError(
                f"model.temperature must be unset or 1 with model.thinking, got {self.temperature} "
                "(the API refuses other temperatures when thinking is on)"
            )
        return self


class BuiltinTool(_Model):
    """A tool implemented inside the operator."""

    name: str = Field(
        description="Name of the built-in tool (see README, 'Built-in tools'), e.g. current_time.",
        pattern=TOOL_NAME_PATTERN,
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Tool-specific configuration; each built-in documents its keys.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ServiceRef(_Model):
    """An in-cluster Service that serves a webhook tool."""

    name: str = Field(description="Service name.", pattern=DNS_LABEL_PATTERN, max_length=63)
    namespace: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="Service namespace; defaults to the run's namespace.",
    )
    port: int = Field(default=80, ge=1, le=65535, description="Service port.")
    path: str = Field(default="/", max_length=2048, description="HTTP path of the tool endpoint.")
    scheme: Literal["http", "https"] = Field(default="http", description="URL scheme.")


class HTTPTool(_Model):
    """A webhook tool: the operator POSTs the validated input as JSON and returns the answer."""

    name: ToolName = Field(description="Tool name the model sees. Must be unique within the run.")
    description: str = Field(description="What the tool does, for the model.", min_length=1, max_length=4096)
    input_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object"},
        description="JSON Schema of the tool input; inputs are validated before any request is sent.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://", description="Endpoint URL.")
    service: ServiceRef | None = Field(
        default=None, description="In-cluster Service reference; alternative to url."
    )
    headers_from: SecretKeyRef | None = Field(
        default=None,
        description="Secret key whose value is a JSON object of extra request headers.",
    )
    timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Timeout of one request; a timeout is a tool error the model sees (not retried).",
    )
    auth_errors_recoverable: bool = Field(
        default=False,
        description=(
            "Treat 401/403 answers as recoverable tool errors the model sees, instead of ending the "
            "run with FatalToolError (the default: a credential problem cannot be fixed by the model)."
        ),
    )


class MCPServer(_Model):
    """A streamable-HTTP MCP server whose tools are offered to the model."""

    name: ToolName = Field(description="Server name; its tools are offered as <name>_<tool>.")
    url: str = Field(max_length=2048, pattern=r"^https?://", description="MCP endpoint URL.")
    allowed_tools: list[ToolName] | None = Field(
        default=None,
        description="Only these tools of the server are offered; all of them when unset.",
    )
    headers_from: SecretKeyRef | None = Field(
        default=None,
        description="Secret key whose value is a JSON object of extra request headers.",
    )


class ToolSpec(_Model):
    """One entry of spec.tools: exactly one of builtin, http or mcp."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.builtin) ? 1 : 0) + (has(self.http) ? 1 : 0)"
                    " + (has(self.mcp) ? 1 : 0) == 1",
                    "message": "a tool needs exactly one of builtin, http, mcp",
                }
            ]
        }
    )

    builtin: BuiltinTool | None = Field(default=None, description="A built-in tool.")
    http: HTTPTool | None = Field(default=None, description="A webhook tool.")
    mcp: MCPServer | None = Field(default=None, description="An MCP server's tools.")
    requires_approval: bool = Field(
        default=False,
        description="Pause the run for a human approval (spec.approvals) before each call.",
    )
    write_key: str | None = Field(
        default=None,
        max_length=253,
        description="Calls sharing a write key run one after another instead of in parallel.",
    )

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> ToolSpec:
        kinds = [k for k in ("builtin", "http", "mcp") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"a tool needs exactly one of builtin, http, mcp; got {kinds or 'none'}")
        return self


class ToolChoice(_Model):
    """How the first turn chooses tools; later turns always use auto."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.type == 'tool') == has(self.name)",
                    "message": "toolChoice.name is required when type is tool, and only then",
                }
            ]
        }
    )

    type: Literal["auto", "any", "tool", "none"] = Field(
        default="auto", description="auto, any (some tool), tool (the named one) or none."
    )
    name: ToolName | None = Field(default=None, description="The forced tool when type is tool.")

    @model_validator(mode="after")
    def _name_iff_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("toolChoice.name is required when type is tool, and only then")
        return self


class LoopDetection(_Model):
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


class Limits(_Model):
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


MAX_OUTPUT_SCHEMA_CHARS = 65_536


class OutputSpec(_Model):
    """A structured answer: the final answer must be JSON valid against a JSON Schema."""

    json_schema: dict[str, Any] = Field(
        alias="schema",
        description=(
            "JSON Schema (draft 2020-12 unless $schema names another) the final answer must match. "
            "It is shown to the model in the system prompt; only references inside it are followed. "
            "The validated JSON is in status.output."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description=(
            "Answers that are not valid JSON for the schema are sent back with the validation errors "
            "this many times; then the run ends InvalidOutput."
        ),
    )

    @field_validator("json_schema")
    @classmethod
    def _usable_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        problem = json_schema_problem(schema)
        if problem is not None:
            raise ValueError(problem)
        return schema


def json_schema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` cannot check answers, or None: caught at admission, before anything is spent."""
    size = len(json.dumps(schema, separators=(",", ":"), default=str))
    if size > MAX_OUTPUT_SCHEMA_CHARS:
        return f"is {size} characters as JSON; at most {MAX_OUTPUT_SCHEMA_CHARS} are allowed"
    validator = json_schema_validator_class(schema)
    if validator is None:
        return f"$schema {schema.get('$schema')!r} is not a JSON Schema draft this operator knows"
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path).lstrip(".")
        return f"not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    return _unresolvable_ref(schema)


def json_schema_validator_class(schema: dict[str, Any]) -> type[jsonschema.protocols.Validator] | None:
    """The draft ``$schema`` names (2020-12 when it names none), or None for an unknown one."""
    dialect = schema.get("$schema")
    if dialect is None:
        return jsonschema.Draft202012Validator
    if not isinstance(dialect, str):
        return None
    try:
        referencing.jsonschema.specification_with(dialect)
    except referencing.jsonschema.UnknownDialect:
        return None
    return jsonschema.validators.validator_for(schema)


#: Keywords whose values are data, not subschemas: a "$ref" key inside them is no reference.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _unresolvable_ref(schema: dict[str, Any]) -> str | None:
    """The first $ref that would need the network or points at nothing, described; else None.

    Validation never fetches anything (the operator has no business reaching arbitrary URLs
    from inside a cluster), so a schema must carry what it references, under $defs.
    """

    def walk(node: Any, resource: dict[str, Any]) -> str | None:
        if isinstance(node, list):
            return next((p for item in node if (p := walk(item, resource)) is not None), None)
        if not isinstance(node, dict):
            return None
        if isinstance(node.get("$id"), str) and node is not schema:
            resource = node
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith(META_SCHEMA_PREFIXES):
            if not ref.startswith("#"):
                return (
                    f"$ref {ref!r} points outside the schema; only references inside it "
                    "(#/$defs/...) are followed"
                )
            if ref.startswith("#/") and not _pointer_exists(resource, ref[1:]):
                return f"$ref {ref!r} points at nothing in the schema"
        for key, value in node.items():
            if key not in _DATA_KEYWORDS and (problem := walk(value, resource)) is not None:
                return problem
        return None

    return walk(schema, schema)


META_SCHEMA_PREFIXES = ("http://json-schema.org/", "https://json-schema.org/")


def _pointer_exists(document: Any, pointer: str) -> bool:
    node = document
    for raw in pointer.split("/")[1:]:
        token = urllib.parse.unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False
    return True


class ClearToolResults(_Model):
    """Old tool results replaced, in what is sent, by a short marker: the lightest way to save context."""

    enabled: bool = Field(default=True, description="Whether old tool results are cleared.")
    keep_newest: int = Field(
        default=8,
        ge=1,
        le=1000,
        description=(
            "Successful tool results kept whole: the newest this many. Older ones larger than minChars "
            "are sent as a marker naming the tool, the call id, the size and how to get it again. "
            "Failed results (is_error) are never cleared. The transcript keeps every result whole."
        ),
    )
    min_chars: int = Field(
        default=1024,
        ge=0,
        le=1_000_000,
        description="Results shorter than this are never cleared: they cost little, and clearing "
        "them would only move the cached prefix.",
    )
    batch: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "Results are cleared this many at a time (so between keepNewest and keepNewest+batch-1 "
            "stay whole): each clearing changes an earlier message, where the cached prefix of the "
            "conversation ends, so batching keeps the cache valid for several turns. 1 clears each "
            "result as soon as it falls out of the newest keepNewest."
        ),
    )
    strategy: Literal["Client", "Server"] = Field(
        default="Client",
        description=(
            "Client: the operator replaces old results in what it sends, so any "
            "Messages-API-compatible server works. Server: the Messages API clears them (its context "
            "editing beta, clear_tool_uses_20250919): tool uses beyond the newest keepNewest once "
            "keepNewest+batch of them are in the request, failed and small results included (minChars "
            "does not apply); only an API that offers the beta accepts it."
        ),
    )


class Compaction(_Model):
    """A summary of the work so far replaces the older turns in what is sent, near the window's limit."""

    enabled: bool = Field(default=True, description="Whether the conversation is compacted.")
    threshold_percent: int = Field(
        default=80,
        ge=10,
        le=95,
        description=(
            "Compact when the next request's estimated input reaches this percentage of the model's "
            "context window (the operator's table, or contextWindowTokens). The summary request is "
            "a model request of its own, tools off: its tokens count in usage, tokenBudget and "
            "costBudgetUSD, not in maxIterations."
        ),
    )
    keep_newest_turns: int = Field(
        default=2,
        ge=1,
        le=100,
        description="Model turns (with their tool results) sent whole after the summary.",
    )
    strategy: Literal["Client", "Server"] = Field(
        default="Client",
        description=(
            "Client: the operator asks for the summary in a request of its own, so any "
            "Messages-API-compatible server works. Server: the Messages API compacts (its compaction "
            "beta, compact_20260112) when a request's input reaches thresholdPercent of the window "
            "(the API's default of 150000 tokens when the window is unknown); the summary comes back "
            "in the answer and is sent back with it. keepNewestTurns does not apply; only an API "
            "that offers the beta accepts it."
        ),
    )


class ContextSpec(_Model):
    """How the conversation is kept within the model's context window; what is stored never changes."""

    clear_tool_results: ClearToolResults = Field(
        default_factory=ClearToolResults, description="Clearing of old tool results."
    )
    compaction: Compaction = Field(default_factory=Compaction, description="Summary-based compaction.")
    context_window_tokens: int | None = Field(
        default=None,
        ge=1024,
        le=10_000_000,
        description=(
            "The model's context window in tokens. Defaults to the operator's table of windows per "
            "model (AGENTRUN_CONTEXT_WINDOWS overrides it); set it for a model the table does not know."
        ),
    )


class Approval(_Model):
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
    "systemPrompt",
    "model",
    "tools",
    "toolChoice",
    "requiredTools",
    "limits",
    "serviceAccountName",
    "output",
    "context",
)


class AgentRunSpec(_Model):
    """The desired run. Immutable once created, except cancel, approvals and ttlSecondsAfterFinished."""

    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [APPROVALS_KEPT, THINKING_TOOL_CHOICE]}
    )

    task: str = Field(
        min_length=1,
        max_length=MAX_TASK_CHARS,
        description="The task given to the agent as the first user message.",
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
        description="ServiceAccount (in the run's namespace) that Kubernetes tools impersonate.",
    )
    cancel: bool = Field(default=False, description="Set to true to stop the run (phase Cancelled).")
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the AgentRun this many seconds after it finished.",
    )
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
    def _thinking_lets_the_model_choose(self) -> AgentRunSpec:
        choice = self.tool_choice
        if self.model.thinking is not None and choice is not None and choice.type in ("any", "tool"):
            raise ValueError(
                f"toolChoice.type {choice.type} forces a tool call, which the API refuses with "
                "model.thinking; use auto or none"
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
        return names
