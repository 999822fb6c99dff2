"""The tools a run may call (built-in, webhook, MCP, agent, A2A) and how the first request may force one."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from agentrun.api.spec_base import DNS_LABEL_PATTERN, SecretKeyRef, SpecModel, ToolName

#: The built-in tools, by name: an enum of the CRD, so the API server refuses a name no operator
#: implements when the run is applied, not when it starts (tools/registry.py implements each one).
BuiltinToolName = Literal[
    "calculator",
    "current_time",
    "http_fetch",
    "kubernetes_events",
    "kubernetes_get",
    "kubernetes_list",
    "pod_logs",
]


class BuiltinTool(SpecModel):
    """A tool implemented inside the operator."""

    name: BuiltinToolName = Field(
        description="Name of the built-in tool (see docs/tools.md, 'Built-in tools'), e.g. current_time.",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Tool-specific configuration; each built-in documents its keys.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ServiceRef(SpecModel):
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


class HTTPTool(SpecModel):
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


class MCPServer(SpecModel):
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


class AgentToolRef(SpecModel):
    """The Agent a child run is created from (same namespace as the run)."""

    name: str = Field(description="Name of the Agent.", pattern=DNS_LABEL_PATTERN, max_length=63)


class AgentTool(SpecModel):
    """A sub-agent: each call creates a child AgentRun from an Agent, with the call's task, and
    answers with the child's result (see docs/agents.md, 'Sub-agents')."""

    name: ToolName = Field(description="Tool name the model sees. Must be unique within the run.")
    agent_ref: AgentToolRef = Field(description="The Agent each call runs as a child AgentRun.")
    description: str = Field(
        description="What the sub-agent does and when to call it, for the model.",
        min_length=1,
        max_length=4096,
    )


class A2ATool(SpecModel):
    """A remote agent spoken to over A2A (the Agent2Agent protocol): one tool whose input is the message
    (see docs/a2a.md, 'Calling remote agents')."""

    name: ToolName = Field(description="Tool name the model sees. Must be unique within the run.")
    url: str = Field(
        max_length=2048,
        pattern=r"^https?://",
        description=(
            "The remote agent's base URL: its Agent Card is read from <url>/.well-known/agent-card.json "
            "when the run starts, and tasks go to the JSON-RPC endpoint the card names."
        ),
    )
    description: str | None = Field(
        default=None,
        max_length=4096,
        description="What the model is told the agent does; by default the card's description and skills.",
    )
    headers_from: SecretKeyRef | None = Field(
        default=None,
        description=(
            "Secret key whose value is a JSON object of extra request headers (e.g. Authorization), sent "
            "when reading the card and with every request."
        ),
    )
    timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description=(
            "How long one call may wait for the remote task to end (retries included), in place of "
            "limits.toolTimeoutSeconds; then the task is canceled and the model gets a timeout error."
        ),
    )


class ToolSpec(SpecModel):
    """One entry of spec.tools: exactly one of builtin, http, mcp, agent or a2a."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.builtin) ? 1 : 0) + (has(self.http) ? 1 : 0)"
                    " + (has(self.mcp) ? 1 : 0) + (has(self.agent) ? 1 : 0) + (has(self.a2a) ? 1 : 0) == 1",
                    "message": "a tool needs exactly one of builtin, http, mcp, agent, a2a",
                }
            ]
        }
    )

    builtin: BuiltinTool | None = Field(default=None, description="A built-in tool.")
    http: HTTPTool | None = Field(default=None, description="A webhook tool.")
    mcp: MCPServer | None = Field(default=None, description="An MCP server's tools.")
    agent: AgentTool | None = Field(default=None, description="A sub-agent run as a child AgentRun.")
    a2a: A2ATool | None = Field(
        default=None, alias="a2a", description="A remote agent called over the A2A protocol."
    )
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
        kinds = [k for k in ("builtin", "http", "mcp", "agent", "a2a") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"a tool needs exactly one of builtin, http, mcp, agent, a2a; got {kinds or 'none'}"
            )
        return self


class ToolChoice(SpecModel):
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
