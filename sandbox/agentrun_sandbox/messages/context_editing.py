"""Server-side context management, as the Messages API's betas do it (``context_management.edits``).

Two edits are served: ``clear_tool_uses_20250919`` (beta ``context-management-2025-06-27``) replaces
the results of all but the newest ``keep`` tool uses with a placeholder once its trigger is reached,
in what the script and the usage see, and reports it in ``context_management.applied_edits``;
``compact_20260112`` (beta ``compact-2026-01-12``) answers a request whose input (from its latest
compaction block on, since the API drops what comes before one) reaches the trigger with a
``compaction`` block first, and reports the compaction's own tokens only in ``usage.iterations``,
as the API does. A compaction block must come back verbatim: its ``encrypted_content`` is derived
from its ``content``, and the assistant message it was served in must start with it (400 otherwise).
``clear_thinking_20251015`` is accepted and does nothing here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun_sandbox.messages.protocol import ProtocolError
from agentrun_sandbox.messages.wire import estimate_input_tokens, estimate_tokens

CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
COMPACTION_BETA = "compact-2026-01-12"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
BETA_OF = {
    CLEAR_TOOL_USES: CONTEXT_MANAGEMENT_BETA,
    CLEAR_THINKING: CONTEXT_MANAGEMENT_BETA,
    COMPACT: COMPACTION_BETA,
}
#: The API's defaults.
CLEAR_TRIGGER_TOKENS = 100_000
CLEAR_KEEP = 3
COMPACT_TRIGGER_TOKENS = 150_000
CLEARED = "[tool result cleared by context management]"


def compaction_key(content: str) -> str:
    """What the server puts in ``encrypted_content``: derived from the summary, so a changed one shows."""
    return "cmp_" + hashlib.sha256(b"agentrun-fake-compaction\x1f" + content.encode()).hexdigest()


def check_request(request: Mapping[str, Any], betas: Collection[str]) -> None:
    """``context_management`` and compaction blocks need their beta headers, and known edits."""
    management = request.get("context_management")
    if management is not None:
        if not isinstance(management, dict) or not isinstance(management.get("edits"), list):
            raise ProtocolError("context_management.edits: Field required")
        for index, edit in enumerate(management["edits"]):
            kind = edit.get("type") if isinstance(edit, dict) else None
            if kind not in BETA_OF:
                raise ProtocolError(f"context_management.edits.{index}.type: unknown edit {kind!r}")
            if BETA_OF[kind] not in betas:
                raise ProtocolError(
                    f"context_management.edits.{index}: {kind} requires the anthropic-beta header "
                    f"{BETA_OF[kind]!r}"
                )
    for m_index, message in enumerate(request.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        for b_index, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict) or block.get("type") != "compaction":
                continue
            where = f"messages.{m_index}.content.{b_index}"
            if COMPACTION_BETA not in betas:
                raise ProtocolError(
                    f"{where}: compaction blocks require the anthropic-beta header {COMPACTION_BETA!r}"
                )
            text = block.get("content")
            if text is not None and block.get("encrypted_content") != compaction_key(str(text)):
                raise ProtocolError(f"{where}: Invalid `encrypted_content` in `compaction` block")


def _edits(body: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    management = body.get("context_management")
    edits = management.get("edits") if isinstance(management, dict) else None
    return {str(e["type"]): e for e in edits or () if isinstance(e, dict)}


def _trigger(edit: Mapping[str, Any], default_tokens: int) -> tuple[str, int]:
    trigger = edit.get("trigger")
    if isinstance(trigger, dict) and isinstance(trigger.get("value"), int):
        return str(trigger.get("type")), int(trigger["value"])
    return "input_tokens", default_tokens


def effective(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body as the model reads it: everything before the latest compaction block is dropped."""
    messages = list(body.get("messages") or [])
    for m_index in range(len(messages) - 1, -1, -1):
        content = messages[m_index].get("content")
        blocks = content if isinstance(content, list) else []
        found = [i for i, b in enumerate(blocks) if isinstance(b, dict) and b.get("type") == "compaction"]
        if found:
            kept = {**messages[m_index], "content": blocks[found[-1] :]}
            return {**body, "messages": [kept, *messages[m_index + 1 :]]}
    return dict(body)


@dataclass(frozen=True)
class Applied:
    """What the server did to one request: the body the script sees, and what to report."""

    body: dict[str, Any]
    applied_edits: list[dict[str, Any]] = field(default_factory=list)
    compact: bool = False


def apply(body: dict[str, Any]) -> Applied:
    """Clearing applied to the body the script and the usage see; whether to compact."""
    edits = _edits(body)
    if not edits:
        return Applied(body)
    seen = body
    applied: list[dict[str, Any]] = []
    clear = edits.get(CLEAR_TOOL_USES)
    if clear is not None:
        seen, cleared, tokens = _cleared(body, clear)
        if cleared:
            applied.append(
                {"type": CLEAR_TOOL_USES, "cleared_tool_uses": cleared, "cleared_input_tokens": tokens}
            )
    compact = False
    if COMPACT in edits:
        kind, value = _trigger(edits[COMPACT], COMPACT_TRIGGER_TOKENS)
        compact = kind == "input_tokens" and estimate_input_tokens(effective(seen)) >= value
    return Applied(seen, applied, compact)


def _cleared(body: dict[str, Any], edit: Mapping[str, Any]) -> tuple[dict[str, Any], int, int]:
    keep = edit.get("keep")
    keep_uses = (
        int(keep["value"]) if isinstance(keep, dict) and isinstance(keep.get("value"), int) else CLEAR_KEEP
    )
    uses = [
        str(block.get("id"))
        for message in effective(body).get("messages") or []
        for block in (message.get("content") if isinstance(message.get("content"), list) else [])
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    kind, value = _trigger(edit, CLEAR_TRIGGER_TOKENS)
    reached = len(uses) >= value if kind == "tool_uses" else estimate_input_tokens(effective(body)) >= value
    if not reached or len(uses) <= keep_uses:
        return body, 0, 0
    older = set(uses[: len(uses) - keep_uses])
    cleared = tokens = 0
    messages = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if not isinstance(content, list):
            messages.append(message)
            continue
        blocks = []
        for block in content:
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_result"
                and block.get("tool_use_id") in older
                and block.get("content") != CLEARED
            ):
                cleared += 1
                tokens += max(estimate_tokens(block.get("content", "")) - estimate_tokens(CLEARED), 0)
                block = {**block, "content": CLEARED}
            blocks.append(block)
        messages.append({**message, "content": blocks})
    return {**body, "messages": messages}, cleared, tokens


def compaction_block(body: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The summary of what the request holds, signed so a changed copy is refused."""
    uses = sum(
        1
        for message in effective(body).get("messages") or []
        for block in (message.get("content") if isinstance(message.get("content"), list) else [])
        if isinstance(block, dict) and block.get("type") == "tool_use"
    )
    text = f"Compacted by the server before step {step}: {uses} tool uses summarized."
    return {"type": "compaction", "content": text, "encrypted_content": compaction_key(text)}


class ServedCompactions:
    """Which (conversation, step) answers began with a compaction block: later requests of the same
    conversation must send that assistant message with the block first (the API would otherwise
    read the whole history again)."""

    def __init__(self) -> None:
        self._served: set[tuple[str, int]] = set()

    def add(self, conversation: str, step: int) -> None:
        self._served.add((conversation, step))

    def clear(self) -> None:
        self._served.clear()

    def check_kept(self, body: Mapping[str, Any], conversation: str, first_step: int = 0) -> None:
        assistants = [
            (index, m)
            for index, m in enumerate(body.get("messages") or [])
            if isinstance(m, dict) and m.get("role") == "assistant"
        ]
        for step, (index, message) in enumerate(assistants, start=first_step):
            if (conversation, step) not in self._served:
                continue
            content = message.get("content")
            first = content[0] if isinstance(content, list) and content else None
            if not isinstance(first, dict) or first.get("type") != "compaction":
                raise ProtocolError(
                    f"messages.{index}.content.0: the compaction block of this assistant message was not "
                    "sent back; send the response's content unchanged"
                )
