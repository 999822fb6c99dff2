"""Text for `kubectl agentrun transcript|trace|quota`: pure functions of what the API server stores.

What a person debugging a run needs at a glance: who said what, which tools were called with
which input, what came back and which calls failed, and per iteration where tokens and time went;
and what a namespace owner needs of its quotas: what is used against each limit, what requests in
flight hold, and what was refused or lost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
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


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """`kubectl get` layout: columns padded to their widest cell, three spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _section(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "0"


def _dollars(value: Any) -> str:
    """Dollars as the ledger's decimal strings (or numbers) hold them, to the cent; never a float's noise."""
    try:
        amount = Decimal(str(value)) if value is not None and not isinstance(value, bool) else Decimal(0)
    except InvalidOperation:
        return "?"
    if not amount.is_finite():
        return "?"
    if 0 < amount < Decimal("0.01"):
        return "<$0.01"
    return f"${amount:.2f}"


def _against(used: str, hard: Any, money: bool = False) -> str:
    """ "used/hard", or the usage alone when the quota does not limit it."""
    if hard is None:
        return used
    return f"{used}/{_dollars(hard) if money else _count(hard)}"


def quota_row(quota: Mapping[str, Any]) -> dict[str, Any]:
    """One quota as `-o json` prints it: its limits and the ledger's counts, missing ones as zero."""
    metadata, spec, status = (_section(quota.get(key)) for key in ("metadata", "spec", "status"))
    used = _section(status.get("used"))
    concurrent = used.get("concurrentRuns")
    if concurrent is None and isinstance(status.get("admitted"), list):
        concurrent = len(status["admitted"])
    return {
        "namespace": metadata.get("namespace"),
        "name": metadata.get("name"),
        "window": spec.get("window") or "Day",
        "windowStart": status.get("windowStart"),
        "hard": dict(_section(spec.get("hard"))),
        "used": {**dict(used), "concurrentRuns": concurrent or 0},
        "reserved": dict(_section(status.get("reserved"))),
        "lost": dict(_section(status.get("lost"))),
        "refused": dict(_section(status.get("refused"))),
        "recorded": bool(status),
    }


def _plural(count: str, word: str) -> str:
    return f"{count} {word}" if count == "1" else f"{count} {word}s"


def render_quotas(quotas: Sequence[Mapping[str, Any]], *, namespaces: bool) -> str:
    """One line per quota, used against hard for each limit (like `kubectl get resourcequota`).

    A cell without "/" is a resource that quota does not limit. ``namespaces`` adds the NAMESPACE
    column, as `kubectl get -A` does. Quotas no operator has written a status for yet are named below
    the table, since their zeros are not a measurement.
    """
    header = ["NAME", "WINDOW", "CONCURRENT", "RUNS", "TOKENS", "COST", "RESERVED TOKENS", "RESERVED COST"]
    header += ["LOST", "REFUSED"]
    table = [["NAMESPACE", *header] if namespaces else header]
    unrecorded = []
    rows = sorted((quota_row(q) for q in quotas), key=lambda r: (str(r["namespace"]), str(r["name"])))
    for row in rows:
        hard, used, reserved = row["hard"], row["used"], row["reserved"]
        refused = row["refused"]
        runs = _plural(_count(refused.get("runs")), "run")
        requests = _plural(_count(refused.get("requests")), "request")
        cells = [
            str(row["name"]),
            str(row["window"]),
            _against(_count(used.get("concurrentRuns")), hard.get("concurrentRuns")),
            _against(_count(used.get("runs")), hard.get("runs")),
            _against(_count(used.get("tokens")), hard.get("tokens")),
            _against(_dollars(used.get("costUSD")), hard.get("costUSD"), money=True),
            _count(reserved.get("tokens")),
            _dollars(reserved.get("costUSD")),
            _count(row["lost"].get("requests")),
            f"{runs}, {requests}",
        ]
        table.append([str(row["namespace"]), *cells] if namespaces else cells)
        if not row["recorded"]:
            unrecorded.append(f"{row['namespace']}/{row['name']}")
    lines = _table(table)
    if unrecorded:
        lines.append("")
        lines.append(
            f"no usage recorded yet for {', '.join(unrecorded)}: no operator has written "
            + ("their status" if len(unrecorded) > 1 else "its status")
        )
    return "\n".join(lines) + "\n"
