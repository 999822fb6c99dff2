"""Text for `kubectl agentrun transcript|trace|quota|tree`: pure functions of what the API server stores.

What a person debugging a run needs at a glance: who said what, which tools were called with
which input, what came back and which calls failed, and per iteration where tokens and time went;
and what a namespace owner needs of its quotas: what is used against each limit, what requests in
flight hold, and what was refused or lost; and for a run that fans out, where each child stands and what the
whole tree spent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from agentrun.api import LABEL_AGENT, LABEL_PARENT_UID
from agentrun.api.phases import FINISHED_PHASES
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


_SANDBOX_KEYS = ("concurrentSandboxes", "sandboxCPU", "sandboxMemory")


def _quantity_against(used: Any, hard: Any) -> str:
    """A Kubernetes quantity used against its limit, both as stored ("1500m/4", "0/8Gi")."""
    shown = str(used) if isinstance(used, str | int) and str(used) else "0"
    return shown if hard is None else f"{shown}/{hard}"


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
    rows = sorted((quota_row(q) for q in quotas), key=lambda r: (str(r["namespace"]), str(r["name"])))
    # The sandbox columns only when a quota shown limits or counts sandboxes (its status has them).
    sandboxes = any(
        key in row["hard"] or row["used"].get(key) is not None for row in rows for key in _SANDBOX_KEYS
    )
    header = ["NAME", "WINDOW", "CONCURRENT", "RUNS", "TOKENS", "COST", "RESERVED TOKENS", "RESERVED COST"]
    header += ["LOST", "REFUSED"]
    header += ["SANDBOXES", "SANDBOX CPU", "SANDBOX MEMORY"] if sandboxes else []
    table = [["NAMESPACE", *header] if namespaces else header]
    unrecorded = []
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
        if sandboxes:
            cells += [
                _against(_count(used.get("concurrentSandboxes")), hard.get("concurrentSandboxes")),
                *(_quantity_against(used.get(key), hard.get(key)) for key in ("sandboxCPU", "sandboxMemory")),
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


@dataclass(frozen=True)
class RunNode:
    """One run of a tree and its children, oldest child first."""

    run: Mapping[str, Any]
    children: tuple[RunNode, ...] = ()


def _created(run: Mapping[str, Any]) -> tuple[str, str]:
    """RFC 3339 timestamps in UTC sort as strings; the name breaks ties within one second."""
    metadata = _section(run.get("metadata"))
    return str(metadata.get("creationTimestamp") or ""), str(metadata.get("name") or "")


def run_tree(root: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> RunNode:
    """The root and its descendants among ``runs``, linked by the parent-uid label.

    Built from one listing rather than one request per node: a fan-out of hundreds of children costs
    one LIST. A uid seen twice (labels edited by hand into a loop) is shown once.
    """
    by_parent: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        parent = _section(_section(run.get("metadata")).get("labels")).get(LABEL_PARENT_UID)
        if isinstance(parent, str):
            by_parent.setdefault(parent, []).append(run)
    seen: set[str] = set()

    def node(run: Mapping[str, Any]) -> RunNode:
        uid = str(_section(run.get("metadata")).get("uid") or "")
        seen.add(uid)
        children = sorted(by_parent.get(uid, []) if uid else [], key=_created)
        fresh = [child for child in children if _section(child.get("metadata")).get("uid") not in seen]
        seen.update(str(_section(child.get("metadata")).get("uid")) for child in fresh)
        return RunNode(run, tuple(node(child) for child in fresh))

    return node(root)


def _usage(run: Mapping[str, Any]) -> Mapping[str, Any]:
    return _section(_section(run.get("status")).get("usage"))


def _tokens(run: Mapping[str, Any]) -> int:
    value = _usage(run).get("totalTokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _decimal(value: Any) -> Decimal | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return None
    return amount if amount.is_finite() else None


def _finished(run: Mapping[str, Any]) -> bool:
    return _section(run.get("status")).get("phase") in FINISHED_PHASES


def _node_row(node: RunNode) -> dict[str, Any]:
    metadata, spec, status = (_section(node.run.get(key)) for key in ("metadata", "spec", "status"))
    agent = _section(metadata.get("labels")).get(LABEL_AGENT) or _section(spec.get("agentRef")).get("name")
    iterations = status.get("iterations")
    return {
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace"),
        "uid": metadata.get("uid"),
        "agent": agent,
        "phase": status.get("phase"),
        "stopReason": status.get("stopReason"),
        "iterations": iterations if isinstance(iterations, int) and not isinstance(iterations, bool) else 0,
        "tokens": _tokens(node.run),
        "costUSD": _usage(node.run).get("costUSD"),
    }


def _nodes(node: RunNode) -> list[RunNode]:
    return [node, *(n for child in node.children for n in _nodes(child))]


def tree_total(root: RunNode) -> dict[str, Any]:
    """What the whole tree spent, each token once.

    A child's usage is added to its parent's when the parent records the child's result, so a
    finished run is already in its parent's numbers: the total is the root's usage plus that of
    every run still going (whose finished children are, in turn, in its own). Runs with tokens but
    no price (a model missing from the price table) are named: the dollars leave them out.
    """
    counted = [node.run for node in _nodes(root) if node is root or not _finished(node.run)]
    cost = Decimal(0)
    priced = False
    unpriced = []
    for run in counted:
        amount = _decimal(_usage(run).get("costUSD"))
        if amount is not None:
            cost, priced = cost + amount, True
        elif _tokens(run):
            unpriced.append(_section(run.get("metadata")).get("name"))
    everything = _nodes(root)
    return {
        "runs": len(everything),
        "active": sum(1 for node in everything if not _finished(node.run)),
        "tokens": sum(_tokens(run) for run in counted),
        "costUSD": str(cost) if priced else None,
        "unpriced": unpriced,
    }


def tree_json(root: RunNode) -> dict[str, Any]:
    """`-o json`: the nested runs (each with its ``children``) and the tree's total."""

    def nested(node: RunNode) -> dict[str, Any]:
        return {**_node_row(node), "children": [nested(child) for child in node.children]}

    return {"run": nested(root), "total": tree_total(root)}


def _cost(value: Any) -> str:
    """Per-run dollars to a hundredth of a cent: a child's spend is often well below a cent."""
    amount = _decimal(value)
    return "-" if amount is None else f"${amount:.4f}"


def render_tree(root: RunNode) -> str:
    """`kubectl get` columns with the NAME cell drawn as a tree, then the tree's total."""
    table = [["NAME", "AGENT", "PHASE", "STOP REASON", "ITERATIONS", "TOKENS", "COST"]]

    def rows(node: RunNode, lead: str, branch: str) -> None:
        row = _node_row(node)
        table.append(
            [
                f"{branch}{row['name']}",
                str(row["agent"] or "-"),
                str(row["phase"] or "-"),
                str(row["stopReason"] or "-"),
                str(row["iterations"]),
                str(row["tokens"]),
                _cost(row["costUSD"]),
            ]
        )
        for index, child in enumerate(node.children):
            last = index == len(node.children) - 1
            rows(child, lead + ("   " if last else "│  "), lead + ("└─ " if last else "├─ "))

    rows(root, "", "")
    total = tree_total(root)
    cost = _cost(total["costUSD"]) if total["costUSD"] is not None else "no price"
    if total["unpriced"]:
        cost = f"{cost} (without {', '.join(str(n) for n in total['unpriced'])}: no price)"
    runs = _plural(str(total["runs"]), "run")
    lines = [
        *_table(table),
        "",
        f"Total: {runs} ({total['active']} active), {total['tokens']} tokens, {cost}",
    ]
    return "\n".join(lines) + "\n"
