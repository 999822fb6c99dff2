"""What is sent of a conversation: the stored messages, compacted and with old tool results cleared.

The run's state keeps every message as the model wrote it and the tools answered; the transcript
stores exactly that. This module derives, before every request, the view that is sent instead:
the task and the latest summary in place of the summarized turns, then the turns after it, with
successful tool results older than the newest few replaced by a marker. The view is a pure function
of the state and the config, so a resumed run sends what it would have sent without the restart.

Sizes are estimated, not counted: the last response reported how many input tokens its request
had, and what changed since is estimated from characters (`CHARS_PER_TOKEN`, on the safe side: real
tokenizers give more characters per token for prose, fewer for dense JSON). Without a report (the
first request, the first after a compaction) the whole request is estimated from characters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrun import json_text
from agentrun.api.stops import Outcome, StopReason
from agentrun.loop.config import ContextConfig
from agentrun.loop.protocols import Block, Message, ModelRequest, ServerContextEdits, ToolDefinition
from agentrun.loop.state import Compaction, RunState, SentView
from agentrun.loop.steps import Compact, Finish

CHARS_PER_TOKEN = 3
#: Starts the instruction of a summary request (the fake Messages API recognises it by this).
SUMMARY_REQUEST = "[context compaction]"
SUMMARY_PROMPT = (
    f"{SUMMARY_REQUEST} The conversation is near the context window's limit, so the turns above "
    "will be replaced by your summary of them. Write that summary now, for yourself: what the task "
    "is, what you have done and found (names, numbers, identifiers, results that matter), what "
    "failed and why, and what is left to do. Do not call tools; reply with the summary only."
)


def chars_of(value: Any) -> int:
    """The characters of ``value`` as compact JSON (json_text: the text json.dumps writes, faster)."""
    return len(json_text.encode(value, default=str).decode())


def view_chars(state: RunState, view: Sequence[Message]) -> int:
    """``chars_of(list(view))``, with each stored message serialised once per run, not per request.

    Messages of the view that are not stored ones (the task with the summary, a message with
    cleared results) are measured afresh; they are few and small.
    """
    if not view:
        return 2
    stored = {id(m) for m in state.messages}
    total = len(view) + 1  # the brackets, and a comma between two messages
    for message in view:
        key = id(message)
        entry = state.measured.get(key)
        if entry is not None and entry[0] is message:
            total += entry[1]
            continue
        size = chars_of(message)
        if key in stored:
            state.measured[key] = (message, size)
        total += size
    return total


def tokens_of_chars(chars: int) -> int:
    return math.ceil(max(chars, 0) / CHARS_PER_TOKEN)


def summary_block(compaction: Compaction) -> Block:
    return {
        "type": "text",
        "text": (
            f'<summary turns="{compaction.turns}">\n{compaction.summary}\n</summary>\n'
            f"The {compaction.turns} turns before this point were replaced by the summary above "
            "(written by you) to keep the conversation within the context window. Continue the task."
        ),
    }


def compacted(messages: Sequence[Message], compaction: Compaction | None) -> list[Message]:
    """The task, the summary, then every message from the boundary on."""
    if compaction is None or not messages:
        return list(messages)
    task = messages[0]
    first = {**task, "content": [*task["content"], summary_block(compaction)]}
    return [first, *messages[compaction.boundary :]]


def _size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    return chars_of(content)


def cleared(messages: Sequence[Message], cfg: ContextConfig) -> list[Message]:
    """Successful tool results beyond the newest `keep_tool_results` sent as a marker, in batches.

    Failed results stay: the model needs to see what did not work. Small results stay: they cost
    little, and every result cleared moves the cached prefix of the conversation.
    """
    if not cfg.clear_tool_results or cfg.clear_on_server:
        return list(messages)
    names: dict[str, str] = {}
    results: list[tuple[int, int]] = []  # (message index, block index) of clearable results
    for m_index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for b_index, block in enumerate(content):
            if block.get("type") == "tool_use":
                names[str(block.get("id"))] = str(block.get("name", ""))
            elif block.get("type") == "tool_result" and not block.get("is_error"):
                results.append((m_index, b_index))
    excess = max(len(results) - cfg.keep_tool_results, 0)
    older = results[: excess - excess % cfg.clear_batch]
    out = list(messages)  # a message is copied only where a result in it is cleared
    for m_index, b_index in older:
        content = list(out[m_index]["content"])
        block = content[b_index]
        size = _size(block.get("content", ""))
        if size < cfg.clear_min_chars:
            continue
        call_id = str(block.get("tool_use_id"))
        name = names.get(call_id, "the tool")
        content[b_index] = {
            "type": "tool_result",
            "tool_use_id": call_id,
            "content": (
                f"[cleared to save context: the result of {name} (call {call_id}, {size} characters), "
                f"read earlier. Call {name} again with the same input if you need it.]"
            ),
        }
        out[m_index] = {**out[m_index], "content": content}
    return out


def sent_messages(state: RunState, cfg: ContextConfig) -> list[Message]:
    """The messages of the next request (a new list; its messages are shared, never to be changed).

    Derived once per state of the conversation: the limits check and the request both need it, and
    the messages are only ever appended to, so the same count, last message, compaction and config
    mean the same view.
    """
    messages = state.messages
    last = messages[-1] if messages else None
    cached = state.view
    if (
        cached is not None
        and cached.count == len(messages)
        and cached.last is last
        and cached.config is cfg
        and cached.compaction == state.compaction
    ):
        return list(cached.messages)
    view = cleared(compacted(messages, state.compaction), cfg)
    state.view = SentView(len(messages), last, state.compaction, cfg, view)
    return list(view)


def fixed_chars(system: str | None, tools: Sequence[ToolDefinition]) -> int:
    """What every request carries besides the messages."""
    # A typed tool's instructions, added by the API, counted at 4 characters a token.
    added = sum(4 * t.api_prompt_tokens for t in tools)
    return len(system or "") + chars_of([t.as_api() for t in tools]) + added


def estimate(state: RunState, view: Sequence[Message], fixed: int) -> int:
    """Estimated input tokens of a request sending `view` (see the module docstring)."""
    chars = view_chars(state, view)
    if state.last_input_tokens is None:
        return tokens_of_chars(chars + fixed)
    delta = chars - state.last_sent_chars
    return max(state.last_input_tokens + math.ceil(delta / CHARS_PER_TOKEN), 0)


@dataclass(frozen=True)
class Cut:
    """Where a compaction cuts: `messages[:boundary]` is summarized, the rest sent whole."""

    boundary: int
    turns: int  # assistant messages before the boundary


def plan_cut(state: RunState, keep_turns: int) -> Cut | None:
    """The boundary that keeps the newest `keep_turns` turns (or fewer, down to one) whole.

    The boundary is always an assistant message: tool results follow their tool_use in the next
    message, so no call is ever separated from its result. None: nothing new to summarize.
    """
    messages = state.messages
    previous = state.compaction.boundary if state.compaction is not None else 1
    starts = [
        i
        for i, m in enumerate(messages)
        if i > previous and m.get("role") == "assistant" and messages[i - 1].get("role") == "user"
    ]
    for keep in range(keep_turns, 0, -1):
        if len(starts) >= keep:
            boundary = starts[-keep]
            turns = sum(1 for m in messages[:boundary] if m.get("role") == "assistant")
            return Cut(boundary, turns)
    return None


def last_sent_count(state: RunState) -> int:
    """How many stored messages the last answered request sent: every one before its answer.

    Each assistant message is the answer to a request that sent everything before it, and only user
    messages follow it until the next request; so the newest assistant message marks the last one.
    """
    for index in range(len(state.messages) - 1, -1, -1):
        if state.messages[index].get("role") == "assistant":
            return index
    return len(state.messages)


def summary_messages(state: RunState, cut: Cut, cfg: ContextConfig) -> list[Message]:
    """What the summary request sends: the view of the last request up to the cut, then the instruction.

    Exactly what the model saw last (same cleared results, same previous summary), so the cached
    prefix is read from the cache and the request is no larger than that one was. Clearing is
    derived from the whole conversation a request sends (the newest results stay whole), so it is
    derived from the last request's messages and then cut: cut first, the results just before the
    cut would count as the newest and be sent whole again. The instruction joins the last message,
    a user turn.
    """
    seen = cleared(compacted(state.messages[: last_sent_count(state)], state.compaction), cfg)
    # compacted() sends the task, then messages[compaction.boundary:]; the cut is after that boundary.
    start = state.compaction.boundary - 1 if state.compaction is not None else 0
    view = seen[: cut.boundary - start]
    last = view[-1]
    view[-1] = {**last, "content": [*last["content"], {"type": "text", "text": SUMMARY_PROMPT}]}
    return view


def summary_server_edits(state: RunState, cut: Cut, cfg: ContextConfig) -> ServerContextEdits | None:
    """The server's context management for the summary request: its clearing lowered to match the
    last request's, as the client's is (see summary_messages).

    The API clears all tool uses but the newest `keep` once the request holds `trigger` of them;
    the summary request lacks the tool uses of the turns kept after the cut, so both counts are
    lowered by those, and it clears what the last request cleared. Never below one: the operator
    does not ask the API to keep no tool use at all.
    """
    edits = cfg.server_edits
    if edits is None or edits.clear_keep is None:
        return edits
    after = sum(
        1
        for message in state.messages[cut.boundary : last_sent_count(state)]
        for block in message.get("content") or ()
        if isinstance(block, dict) and block.get("type") == "tool_use"
    )
    trigger = edits.clear_trigger
    return replace(
        edits,
        clear_keep=max(edits.clear_keep - after, 1),
        clear_trigger=max(trigger - after, 1) if trigger is not None else None,
    )


def overflow(state: RunState, cfg: ContextConfig, message: str, request: ModelRequest) -> Compact | Finish:
    """The API refused a request as too long: compact now, unless that is off, on the server, or
    was just done."""
    if (
        cfg.compaction
        and not cfg.compact_on_server
        and (state.compaction is None or state.compaction.iteration < state.iterations)
    ):
        size = tokens_of_chars(chars_of(list(request.messages)) + fixed_chars(request.system, request.tools))
        return Compact(size, refused=message)
    why = (
        "context compaction is off (spec.context.compaction.enabled: false)"
        if not cfg.compaction
        else "context compaction is the Messages API's (spec.context.compaction.strategy: Server), "
        "and it did not make room"
        if cfg.compact_on_server
        else "context management could not make room: the conversation was compacted after the "
        "last model turn and is still too long"
    )
    return Finish(Outcome(StopReason.CONTEXT_WINDOW_EXCEEDED, f"{message} ({why})"))
