"""Text for `kubectl agentrun transcript|trace`: pure functions of the stored transcript.

What a person debugging a run needs at a glance: who said what, which tools were called with
which input, what came back and which calls failed, and per iteration where tokens and time went.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.api.traces import COMPACTION, TraceRow

INDENT = "    "


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _indented(text: str, prefix: str = INDENT) -> list[str]:
    return [prefix + line for line in (text.splitlines() or [""])]


def _result_text(content: Any) -> str:
    """tool_result content is a string or a list of blocks (text, images…)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, Mapping):
                parts.append(f"[{block.get('type', 'block')}]")
        return "\n".join(parts)
    return "" if content is None else _json(content)


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, Mapping)]


def render_transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """Numbered turns; tool calls show their input, results name the call they answer."""
    names: dict[str, str] = {}
    lines: list[str] = []
    for number, message in enumerate(messages, start=1):
        role = str(message.get("role", "?"))
        lines.append(f"[{number}] {role}")
        for block in _blocks(message):
            kind = block.get("type")
            if kind == "text":
                lines.extend(_indented(str(block.get("text", ""))))
            elif kind == "tool_use":
                tool_id, name = str(block.get("id", "")), str(block.get("name", ""))
                names[tool_id] = name
                lines.append(f"{INDENT}-> call {name} ({tool_id})")
                lines.extend(_indented(_json(block.get("input", {})), INDENT * 2))
            elif kind == "tool_result":
                tool_id = str(block.get("tool_use_id", ""))
                label = "error" if block.get("is_error") else "result"
                lines.append(f"{INDENT}<- {label} of {names.get(tool_id, '?')} ({tool_id})")
                lines.extend(_indented(_result_text(block.get("content")), INDENT * 2))
            elif kind in ("thinking", "redacted_thinking"):
                lines.append(f"{INDENT}[{kind}]")
            else:
                lines.append(f"{INDENT}[{kind}] {_json(dict(block))}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n" if lines else ""


def _tools_cell(row: TraceRow) -> str:
    cells = []
    for call in row.tool_calls:
        state = "ok" if call.ok else f"error({call.error_code})" if call.error_code else "error"
        cells.append(f"{call.name} {state} {call.duration_seconds * 1000:.0f}ms")
    return ", ".join(cells) or "-"


def _compaction_cell(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "context compacted"
    return (
        f"context compacted: {entry.get('turns', '?')} turns summarized, next request "
        f"~{entry.get('tokensBefore', '?')} -> ~{entry.get('tokensAfter', '?')} input tokens"
    )


def render_trace(rows: Sequence[TraceRow], compactions: Sequence[Mapping[str, Any]] = ()) -> str:
    """One line per model request, like `kubectl get`: fixed columns, the tool list last.

    A summary request (context compaction) has a row of its own, after the iteration it followed;
    `compactions` (the transcript state's log, in order) says what each one did.
    """
    header = ("ITER", "STOP REASON", "IN", "OUT", "CACHE W", "CACHE R", "TOOLS")
    table = [header]
    summaries = iter(compactions)
    for row in rows:
        u = row.usage
        tools = _tools_cell(row)
        if row.stop_reason == COMPACTION:
            tools = _compaction_cell(next(summaries, None))
        table.append(
            (
                str(row.iteration),
                row.stop_reason or "-",
                str(u.input_tokens),
                str(u.output_tokens),
                str(u.cache_creation_input_tokens),
                str(u.cache_read_input_tokens),
                tools,
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    lines = ["   ".join([*(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)), r[-1]]) for r in table]
    return "\n".join(line.rstrip() for line in lines) + "\n"
