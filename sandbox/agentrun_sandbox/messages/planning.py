"""Choosing the answer to a Messages request: which script and step, which fault, and the reply's wire form.

Decided from the request alone (plus how often each fault has been served), before a byte is sent, so
:mod:`~agentrun_sandbox.messages.serving` only has to deliver the plan, and so a retried request sees
the next fault or the reply in the order the script lists them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.messages.brain import demo_reply
from agentrun_sandbox.messages.protocol import ProtocolError, assistant_turns, first_user_text
from agentrun_sandbox.messages.script import Fault, Reply, Script
from agentrun_sandbox.messages.wire import WireReply, derived_id, estimate_input_tokens, estimate_tokens

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

    @property
    def outcome(self) -> str:
        """The :attr:`~agentrun_sandbox.messages.recording.RecordedRequest.outcome` this plan logs."""
        return self.fault.kind if self.fault else "reply" if self.script else "demo_brain"


def plan(
    body: dict[str, Any], scripts: Sequence[Script], fault_counts: FaultCounts, *, demo_brain: bool
) -> Plan:
    """Chooses what to serve from the request alone, plus the fault counters (which it advances)."""
    text = first_user_text(body)
    conversation = hashlib.sha256(text.encode()).hexdigest()[:16]
    step = assistant_turns(body)
    script = next((s for s in scripts if s.matches(text, body["model"])), None)
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


def wire_reply(body: Mapping[str, Any], plan: Plan, *, max_tokens_cut: bool) -> WireReply:
    """The planned reply as the API would word it: ids derived from the conversation, usage estimated
    where the script leaves it out, and a ``max_tokens`` stop when a truncation fault cuts it."""
    reply = plan.reply
    content: list[dict[str, Any]] = []
    for index, block in enumerate(reply.content):
        block = dict(block)
        if block["type"] == "tool_use" and "id" not in block:
            block = {
                "type": "tool_use",
                "id": derived_id("toolu", plan.conversation, plan.step, index),
                **block,
            }
        content.append(block)
    output_tokens = reply.usage.output_tokens
    if output_tokens is None:
        output_tokens = estimate_tokens(content) if content else 1
    return WireReply(
        message_id=derived_id("msg", plan.conversation, plan.step),
        model=str(body["model"]),
        content=content,
        stop_reason="max_tokens" if max_tokens_cut else reply.wire_stop_reason,
        stop_sequence=None if max_tokens_cut else reply.stop_sequence,
        stop_details=None if max_tokens_cut else reply.stop_details,
        input_tokens=(
            reply.usage.input_tokens if reply.usage.input_tokens is not None else estimate_input_tokens(body)
        ),
        output_tokens=int(body["max_tokens"]) if max_tokens_cut else output_tokens,
        cache_creation_input_tokens=reply.usage.cache_creation_input_tokens,
        cache_read_input_tokens=reply.usage.cache_read_input_tokens,
    )
