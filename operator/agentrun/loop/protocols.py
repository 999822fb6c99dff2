"""The loop's view of the outside world: the model, the tools, the clock and its observers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from agentrun.api.usage import TokenUsage
from agentrun.loop.events import Event

Block = dict[str, Any]
Message = dict[str, Any]


@dataclass(frozen=True)
class ToolDefinition:
    """What the model is told about a tool; the list is fixed for the whole run (cache prefix)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    write_key: str | None = None
    requires_approval: bool = False
    # Each call starts a run of its own (the agent tool kind): calls of one turn share what is left
    # of the run's budgets (CallBudget.siblings).
    spawns_runs: bool = False
    # How long one call may take instead of the run's toolTimeoutSeconds; math.inf: no per-call
    # limit (a child run is bounded by its own timeout and the parent's deadline).
    timeout_seconds: float | None = None
    # A client tool the API defines (e.g. "bash_20250124"): sent as its type and name only, since the
    # model was trained on its schema; `input_schema` is then what the operator checks inputs against.
    api_type: str | None = None
    # What the API adds to every request's input for such a tool (its own instructions), which no
    # byte count of the request shows: reservations and context estimates add it.
    api_prompt_tokens: int = 0

    def as_api(self) -> dict[str, Any]:
        if self.api_type is not None:
            return {"type": self.api_type, "name": self.name}
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema)}


@dataclass(frozen=True)
class Thinking:
    """Extended thinking for every request of a run. The thinking blocks it produces stay in the
    assistant messages unchanged: the API checks their signatures when they come back."""

    budget_tokens: int
    # Think again after each tool result, where the model supports it.
    interleaved: bool = True


@dataclass(frozen=True)
class ServerContextEdits:
    """Context management the Messages API does itself (spec.context strategy Server), as plain
    data: the model adapter words it as the API's beta edits."""

    clear_keep: int | None = None  # clear tool uses beyond the newest this many (None: no clearing)
    clear_trigger: int | None = None  # once the request holds this many tool uses
    compact: bool = False
    compact_trigger_tokens: int | None = None  # None: the API's own default


@dataclass(frozen=True)
class AppliedContextEdits:
    """What the Messages API reports it did to the request's context (strategy Server)."""

    compacted: bool = False  # the answer starts with a compaction block
    cleared_tool_uses: int = 0
    cleared_input_tokens: int = 0
    compaction_usage: TokenUsage | None = None  # the compaction's own tokens, already in usage


@dataclass(frozen=True)
class ModelRequest:
    model: str
    max_tokens: int
    messages: Sequence[Message]
    system: str | None = None
    tools: Sequence[ToolDefinition] = ()
    tool_choice: Mapping[str, Any] | None = None
    temperature: float | None = None
    stop_sequences: Sequence[str] = ()
    # Opaque per-run identity for the provider (Anthropic's metadata.user_id), never a secret.
    user_id: str | None = None
    thinking: Thinking | None = None
    server_context: ServerContextEdits | None = None


@dataclass(frozen=True)
class ModelResponse:
    content: list[Block]
    stop_reason: str | None
    usage: TokenUsage
    model: str
    stop_sequence: str | None = None
    request_id: str | None = None
    stop_details: Mapping[str, Any] | None = None
    context_edits: AppliedContextEdits | None = None


class ModelClient(Protocol):
    async def complete(self, request: ModelRequest) -> ModelResponse: ...


@dataclass(frozen=True)
class CallBudget:
    """What the run has left when a call starts (None: unlimited), and how many calls of the turn
    spawn runs: each of them may take its share, never more than the run has."""

    tokens: int | None = None
    cost_usd: Decimal | None = None
    seconds: float | None = None
    siblings: int = 1


@dataclass(frozen=True)
class ToolCall:
    """One tool_use block to execute, with the key receivers use to de-duplicate retries."""

    id: str
    name: str
    input: Mapping[str, Any]
    idempotency_key: str
    iteration: int
    #: Set for the calls of a turn in which a call spawns a run (tool_calling.call_budget); else unlimited.
    budget: CallBudget = field(default_factory=CallBudget)


@dataclass(frozen=True)
class ToolOutput:
    content: str
    is_error: bool = False
    structured: Mapping[str, Any] = field(default_factory=dict)
    # Model usage the call spent elsewhere on the run's behalf (a child run's): counted in the run's
    # usage, cost and budgets, but never again in metrics or quotas (the child's own run counts it).
    usage_by_model: Mapping[str, TokenUsage] = field(default_factory=dict)


class Tool(Protocol):
    @property
    def definition(self) -> ToolDefinition: ...

    async def call(self, call: ToolCall) -> ToolOutput: ...


class Pricer(Protocol):
    def cost(self, model: str, usage: TokenUsage) -> Decimal | None:
        """Price in USD, or None when the model has no known price (never guessed)."""
        ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def random(self) -> float:
        """Jitter source in [0, 1); injected so tests can make backoff deterministic."""
        ...


class Observer(Protocol):
    async def notify(self, event: Event) -> None: ...


@dataclass(frozen=True)
class Spend:
    """The most one model request may cost: what a quota reserves before the request is sent."""

    tokens: int
    cost_usd: Decimal | None  # None: the model has no price


class Allowance(Protocol):
    """The quotas a run's model requests are held to (None in the loop: no quotas apply).

    Every attempt of every request is reserved before it is sent and settled once its outcome is
    known, so the quotas never count a request the API may have served as free.
    """

    def active(self) -> bool:
        """Whether any quota applies now. When none does, a request goes out unreserved: nothing to
        size, reserve or settle (most namespaces have no quota, and this is every request's path)."""
        ...

    async def reserve(self, spend: Spend) -> object:
        """A ticket for `spend`; waits while other runs' reservations may still free room, raises
        QuotaRefused when the request cannot fit. Cancelled while it waits, it holds nothing."""
        ...

    async def settle(self, ticket: object, usage: TokenUsage | None, cost_usd: Decimal | None) -> None:
        """The reservation becomes `usage` (priced `cost_usd`); None: the outcome is unknown (the
        API may have served it), so the reservation is charged in full."""
        ...
