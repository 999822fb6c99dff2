"""The Messages API request the loop's ModelRequest becomes: its body, betas and cache breakpoints,
and whether it must be streamed. Shared by the SDK path and the direct client (direct_calling), so both
send the same request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from anthropic._constants import MODEL_NONSTREAMING_TOKENS

from agentrun.api.model_names import claude_model
from agentrun.loop.protocols import Message, ModelRequest, ServerContextEdits

#: The Messages API refuses a request with more cache breakpoints than this (system, tools and
#: message blocks together).
MAX_CACHE_BREAKPOINTS = 4
#: Blocks the API does not let carry cache_control (they are cached as part of the prefix anyway).
UNMARKABLE_BLOCKS = frozenset({"thinking", "redacted_thinking"})
INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
#: The betas of server-side context management: clearing tool results (context editing), compaction.
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
COMPACTION_BETA = "compact-2026-01-12"
#: The SDK refuses a non-streaming request whose answer may take longer than this; it expects
#: ``max_tokens`` to take up to an hour per 128,000 tokens.
NON_STREAMING_SECONDS = 10 * 60
TOKENS_PER_HOUR = 128_000


def needs_streaming(model: str, max_tokens: int, *, read_timeout: float = NON_STREAMING_SECONDS) -> bool:
    """Whether the SDK would refuse this request without streaming (the same rule as its own check),
    or its answer may take longer than the client waits for a read: a non-streamed answer sends
    nothing until it is complete, a streamed one keeps sending events."""
    # A Bedrock or Vertex AI ID has the limit of the Claude model it names.
    limit = MODEL_NONSTREAMING_TOKENS.get(model) or MODEL_NONSTREAMING_TOKENS.get(claude_model(model))
    if limit is not None and max_tokens > limit:
        return True
    expected = 60 * 60 * max_tokens / TOKENS_PER_HOUR
    return expected > min(NON_STREAMING_SECONDS, read_timeout)


def build_params(request: ModelRequest) -> dict[str, Any]:
    """The request body: system prompt and tool list marked once each, the conversation as
    `with_cache_breakpoints` marks it, and thinking as the spec asks for it."""
    breakpoints = 0
    params: dict[str, Any] = {"model": request.model, "max_tokens": request.max_tokens}
    if request.system:
        params["system"] = [{"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}]
        breakpoints += 1
    if request.tools:
        tools = [tool.as_api() for tool in request.tools]
        tools[-1]["cache_control"] = {"type": "ephemeral"}
        params["tools"] = tools
        breakpoints += 1
    params["messages"] = with_cache_breakpoints(request.messages, MAX_CACHE_BREAKPOINTS - breakpoints)
    betas: list[str] = []
    extra_body: dict[str, Any] = {}
    if request.thinking is not None:
        params["thinking"] = {"type": "enabled", "budget_tokens": request.thinking.budget_tokens}
        if request.thinking.interleaved and request.tools:
            betas.append(INTERLEAVED_THINKING_BETA)
    if request.server_context is not None:
        edits, edit_betas = context_edits(request.server_context)
        if edits:
            # The non-beta create() has no context_management argument; the body field is the beta's.
            extra_body["context_management"] = {"edits": edits}
            betas.extend(edit_betas)
    if request.tool_choice is not None:
        params["tool_choice"] = dict(request.tool_choice)
    if request.temperature is not None:
        # The SDK (2.12) has no temperature argument any more; the body field is still the API's.
        extra_body["temperature"] = request.temperature
    if extra_body:
        params["extra_body"] = extra_body
    if betas:
        params["extra_headers"] = {"anthropic-beta": ",".join(betas)}
    if request.stop_sequences:
        params["stop_sequences"] = list(request.stop_sequences)
    if request.user_id:
        params["metadata"] = {"user_id": request.user_id}
    return params


def context_edits(server: ServerContextEdits) -> tuple[list[dict[str, Any]], list[str]]:
    """spec.context's Server parts as the API's edits, and the beta headers they need.

    Clearing: tool uses beyond the newest `clear_keep` once the request holds `clear_trigger` of
    them (keepNewest + batch: the client's batching, so the cached prefix stays valid for turns).
    Compaction: at `compact_trigger_tokens` input tokens (the window times thresholdPercent), or
    at the API's own default when the window is unknown.
    """
    edits: list[dict[str, Any]] = []
    betas: list[str] = []
    if server.clear_keep is not None:
        edit: dict[str, Any] = {
            "type": "clear_tool_uses_20250919",
            "keep": {"type": "tool_uses", "value": server.clear_keep},
        }
        if server.clear_trigger is not None:
            edit["trigger"] = {"type": "tool_uses", "value": server.clear_trigger}
        edits.append(edit)
        betas.append(CONTEXT_MANAGEMENT_BETA)
    if server.compact:
        compact: dict[str, Any] = {"type": "compact_20260112"}
        if server.compact_trigger_tokens is not None:
            compact["trigger"] = {"type": "input_tokens", "value": server.compact_trigger_tokens}
        edits.append(compact)
        betas.append(COMPACTION_BETA)
    return edits, betas


def with_cache_breakpoints(messages: Sequence[Message], slots: int) -> list[Message]:
    """The messages to send, the conversation read from cache up to the newest message.

    The cached prefix is tools, system, then messages. The newest message is the last one of this
    request and the end of the next request's unchanged prefix (clearing old tool results or
    compaction may change earlier messages, never the newest): its breakpoint writes the cache the
    next turn reads. The API looks for an earlier cache entry only about 20 blocks
    back from a breakpoint, and a turn of many parallel tool calls adds more than that, so the last
    message of the previous request (the one before the newest assistant message) keeps a
    breakpoint too, where that cache was written. System and tool list keep theirs, so a compacted
    conversation still reads them from cache. Marks go on copies: the loop's state is never changed.
    """
    chosen = [len(messages) - 1] if messages else []
    answered = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), 0
    )
    if answered > 0:
        chosen.append(answered - 1)
    marked = list(messages)
    for index in chosen[: max(slots, 0)]:
        message = _marked(marked[index])
        if message is not None:
            marked[index] = message
    return marked


def _marked(message: Message) -> Message | None:
    """A copy of the message whose last markable block carries a breakpoint; None when it has none."""
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return None
        return {
            **message,
            "content": [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}],
        }
    if not isinstance(content, list):
        return None
    for position in range(len(content) - 1, -1, -1):
        block = content[position]
        if not isinstance(block, dict) or block.get("type") in UNMARKABLE_BLOCKS:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue
        blocks = list(content)
        blocks[position] = {**block, "cache_control": {"type": "ephemeral"}}
        return {**message, "content": blocks}
    return None
