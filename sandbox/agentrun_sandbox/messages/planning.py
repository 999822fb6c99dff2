"""Choosing the answer to a Messages request: which script and step, which fault, and the reply's wire form.

Decided from the request alone (plus how often each fault has been served), before a byte is sent, so
:mod:`~agentrun_sandbox.messages.serving` only has to deliver the plan, and so a retried request sees
the next fault or the reply in the order the script lists them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.messages.brain import demo_reply
from agentrun_sandbox.messages.caching import CacheUsage
from agentrun_sandbox.messages.protocol import ProtocolError, assistant_turns, first_user_text, tool_results
from agentrun_sandbox.messages.script import Fault, HttpError, Reply, Script, text_block
from agentrun_sandbox.messages.wire import (
    WireReply,
    derived_id,
    estimate_input_tokens,
    estimate_tokens,
    thinking_signature,
)

THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
#: How often each (script, conversation, step) was asked for: the next attempt's fault depends on it.
FaultCounts = dict[tuple[str, str, int], int]


@dataclass(frozen=True)
class Plan:
    """What one request gets (``script`` ``None``: the demo brain; ``fault`` replaces or spoils ``reply``)."""

    script: str | None
    step: int
    conversation: str
    reply: Reply
    fault: Fault | None
    cache: CacheUsage | None = None
    """The input side of usage from the server's prompt cache, when it keeps one."""
    compaction: Mapping[str, Any] | None = None
    """A compaction block the server puts first in the answer (server-side compaction)."""
    applied_edits: Sequence[Mapping[str, Any]] = ()
    """Context edits the server applied (``context_management.applied_edits``)."""

    @property
    def outcome(self) -> str:
        """The :attr:`~agentrun_sandbox.messages.recording.RecordedRequest.outcome` this plan logs."""
        return self.fault.kind if self.fault else "reply" if self.script else "demo_brain"


def plan(
    body: dict[str, Any], scripts: Sequence[Script], fault_counts: FaultCounts, *, demo_brain: bool
) -> Plan:
    """Chooses what to serve from the request alone, plus the fault counters (which it advances)."""
    summarized, text = split_summary(first_user_text(body))
    conversation = hashlib.sha256(text.encode()).hexdigest()[:16]
    step = assistant_turns(body) + summarized
    script = next((s for s in scripts if s.matches(text, body["model"])), None)
    if script is not None and script.context_window is not None:
        tokens = estimate_input_tokens(body)
        if tokens > script.context_window:
            message = f"prompt is too long: {tokens} tokens > {script.context_window} maximum"
            return Plan(
                script.key,
                step,
                conversation,
                Reply(),
                HttpError(error_type="invalid_request_error", message=message),
            )
    if summary_requested(body):
        return Plan(script.key if script else None, step, conversation, summary_reply(body, step), None)
    if script is None:
        if not demo_brain:
            raise ProtocolError(
                f"fake Messages API: no script matches model {body['model']!r} and first user message "
                f"{text[:200]!r}, and the demo brain is off"
            )
        return Plan(None, step, conversation, demo_reply(body), None)
    if step >= len(script.steps):
        raise ProtocolError(
            f"fake Messages API: script {script.key!r} has {len(script.steps)} step(s) but the request "
            f"holds {step} assistant message(s), asking for step {step}"
        )
    scripted = script.steps[step]
    thinking_on = thinking_enabled(body)
    if thinking_on:
        check_thinking_kept(body, script, conversation, first_step=summarized)
    elif isinstance(scripted, Reply) and any(b["type"] in THINKING_BLOCKS for b in scripted.content):
        raise ProtocolError(
            f"fake Messages API: script {script.key!r} answers step {step} with thinking blocks, but the "
            "request does not turn thinking on"
        )
    if isinstance(scripted, Fault):
        return Plan(script.key, step, conversation, Reply(), scripted)
    counter = (script.key, conversation, step)
    served = fault_counts.get(counter, 0)
    fault_counts[counter] = served + 1
    for fault in scripted.faults:
        if served < fault.times:
            return Plan(script.key, step, conversation, scripted, fault)
        served -= fault.times
    return Plan(script.key, step, conversation, scripted, None)


#: A client's context compaction: its summary request ends with a text starting so, and the
#: compacted conversation's first user message carries the summary in a tag that says how many
#: model turns it stands for (the step index counts them, so scripts go on where they were).
SUMMARY_REQUEST = "[context compaction]"
SUMMARY_TAG = re.compile(r'<summary turns="(\d+)">.*', re.DOTALL)


def split_summary(text: str) -> tuple[int, str]:
    """(turns a summary stands for, the first user text without it)."""
    found = SUMMARY_TAG.search(text)
    if found is None:
        return 0, text
    before = text[: found.start()]
    # The summary is a text block of its own, joined to the task's with a newline.
    return int(found.group(1)), before[:-1] if before.endswith("\n") else before


def summary_requested(body: Mapping[str, Any]) -> bool:
    messages = body.get("messages") or []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    content = last.get("content")
    texts = [b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
    return last.get("role") == "user" and bool(texts) and str(texts[-1]).startswith(SUMMARY_REQUEST)


def summary_reply(body: Mapping[str, Any], step: int) -> Reply:
    """A summary request is answered by the server itself, not by a script step: it names the tools
    called and how many results the summarized turns held, so tests can see what it stood for."""
    calls = [name for name, _, _ in tool_results(body)]
    names = ", ".join(sorted(set(calls))) or "none"
    return Reply([text_block(f"Summary of {step} turns: {len(calls)} tool results ({names}).")])


def thinking_enabled(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def check_thinking_kept(
    body: Mapping[str, Any], script: Script, conversation: str, *, first_step: int = 0
) -> None:
    """The real API's rule for a request with thinking on: the assistant messages of the current turn
    (since the last user message that is not only tool results; a tool-use loop is one turn) carry
    the thinking blocks they were served with, first and unchanged, signatures included.
    ``first_step`` is the step of the first assistant message (after a compaction, the turns its
    summary stands for)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    turn_start = 0
    for index, message in enumerate(messages):
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text"}]
        if message.get("role") == "user" and any(
            not isinstance(b, dict) or b.get("type") != "tool_result" for b in blocks
        ):
            turn_start = index
    step = first_step
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        scripted = script.steps[step] if step < len(script.steps) else None
        step += 1
        if index < turn_start or not isinstance(scripted, Reply):
            continue
        served = [b for b in wire_content(scripted, conversation, step - 1) if b["type"] in THINKING_BLOCKS]
        content = message.get("content")
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        if blocks and blocks[0].get("type") == "compaction":
            blocks = blocks[1:]  # the server's compaction block comes before the model's own blocks
        sent = blocks[: len(served)]
        where = f"messages.{index}.content"
        kinds = [b.get("type") for b in sent]
        if kinds != [b["type"] for b in served]:
            pairs = enumerate(zip(kinds, served, strict=False))  # sent may hold fewer blocks
            position = next((i for i, (kind, block) in pairs if kind != block["type"]), len(kinds))
            found = kinds[position] if position < len(kinds) else "nothing"
            raise ProtocolError(
                f"{where}.{position}.type: Expected `{served[position]['type']}`, but found `{found}`. When "
                "`thinking` is enabled, a final `assistant` message must start with a thinking block "
                "(preceeding the lastmost set of `tool_use` and `tool_result` blocks)."
            )
        for position, (got, expected) in enumerate(zip(sent, served, strict=True)):
            if {k: v for k, v in got.items() if k != "cache_control"} != expected:
                raise ProtocolError(f"{where}.{position}: Invalid `signature` in `{expected['type']}` block")


def wire_content(reply: Reply, conversation: str, step: int) -> list[dict[str, Any]]:
    """The reply's blocks as served: tool_use ids derived from the conversation and step, thinking signed."""
    content: list[dict[str, Any]] = []
    for index, block in enumerate(reply.content):
        block = dict(block)
        if block["type"] == "tool_use" and "id" not in block:
            block = {"type": "tool_use", "id": derived_id("toolu", conversation, step, index), **block}
        elif block["type"] == "thinking" and "signature" not in block:
            block["signature"] = thinking_signature(block["thinking"])
        content.append(block)
    return content


def wire_reply(body: Mapping[str, Any], plan: Plan, *, max_tokens_cut: bool) -> WireReply:
    """The planned reply as the API would word it: ids derived from the conversation, usage estimated
    where the script leaves it out, and a ``max_tokens`` stop when a truncation fault cuts it."""
    reply = plan.reply
    content = wire_content(reply, plan.conversation, plan.step)
    output_tokens = reply.usage.output_tokens
    if output_tokens is None:
        output_tokens = estimate_tokens(content) if content else 1
    usage = reply.usage
    if (
        plan.cache is not None
        and usage.input_tokens is None
        and not (usage.cache_read_input_tokens or usage.cache_creation_input_tokens)
    ):
        # Input-side numbers the script leaves out come from the server's prompt cache.
        usage = dataclasses.replace(
            usage,
            input_tokens=plan.cache.input_tokens,
            cache_read_input_tokens=plan.cache.cache_read_input_tokens,
            cache_creation_input_tokens=plan.cache.cache_creation_input_tokens,
        )
    iterations: list[dict[str, Any]] | None = None
    if plan.compaction is not None:
        # The compaction read the whole request; the answer was written from its summary on.
        content = [dict(plan.compaction), *content]
        iterations = [
            {
                "type": "compaction",
                "input_tokens": estimate_input_tokens(body),
                "output_tokens": estimate_tokens(plan.compaction["content"]),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            }
        ]
        if usage.input_tokens is None:
            after = {k: body[k] for k in ("system", "tools") if k in body}
            usage = dataclasses.replace(
                usage,
                input_tokens=estimate_input_tokens({**after, "messages": [plan.compaction]}),
                cache_read_input_tokens=0,
                cache_creation_input_tokens=0,
            )
    return WireReply(
        message_id=derived_id("msg", plan.conversation, plan.step),
        model=str(body["model"]),
        content=content,
        stop_reason="max_tokens" if max_tokens_cut else reply.wire_stop_reason,
        stop_sequence=None if max_tokens_cut else reply.stop_sequence,
        stop_details=None if max_tokens_cut else reply.stop_details,
        input_tokens=usage.input_tokens if usage.input_tokens is not None else estimate_input_tokens(body),
        output_tokens=int(body["max_tokens"]) if max_tokens_cut else output_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens,
        iterations=iterations,
        context_management=(
            {"applied_edits": [dict(e) for e in plan.applied_edits]}
            if plan.applied_edits or plan.compaction is not None
            else None
        ),
    )
