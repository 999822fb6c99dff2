"""One run's page: summary, conditions, approvals waiting, the trace and the transcript.

The sections the live stream replaces have ids (``summary``, ``approvals``, ``trace``, ``transcript``);
each is rendered by one function here, for the first page and for every update alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.api.traces import Progress, TraceRow
from agentrun.api.transcripts import Transcript
from agentrun.console.sent_views import cleared_results
from agentrun.console.views import cost_of, definitions, esc, run_link

#: Tool inputs and results longer than this are shown folded (their size is always shown).
FOLD_CHARS = 2000


def size(text: str) -> str:
    n = len(text.encode())
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


def _children(children: Mapping[str, Any]) -> str | None:
    return f"{children.get('total', 0)} ({children.get('active', 0)} active)" if children else None


def _of_at_most(count: object, limit: object) -> str:
    return f"{count} of at most {limit}" if limit else str(count)


def summary(run: Mapping[str, Any]) -> str:
    meta, status, spec = run.get("metadata") or {}, run.get("status") or {}, run.get("spec") or {}
    usage = status.get("usage") or {}
    limits = spec.get("limits") or {}
    children = status.get("children") or {}
    pairs = [
        ("Phase", status.get("phase") or "Pending"),
        ("Stop reason", status.get("stopReason")),
        ("Message", status.get("message")),
        ("Iterations", _of_at_most(status.get("iterations", 0), limits.get("maxIterations"))),
        ("Tool calls", status.get("toolCalls", 0)),
        ("Input tokens", usage.get("inputTokens", 0)),
        ("Output tokens", usage.get("outputTokens", 0)),
        (
            "Cache read / write",
            f"{usage.get('cacheReadInputTokens', 0)} / {usage.get('cacheCreationInputTokens', 0)}",
        ),
        ("Cost", cost_of(status)),
        ("Cost budget", limits.get("costBudgetUSD") and f"${limits['costBudgetUSD']}"),
        ("Token budget", limits.get("tokenBudget")),
        ("Started", status.get("startTime")),
        ("Finished", status.get("completionTime")),
        ("Result", status.get("result")),
        (
            "Children",
            (children and f"{children.get('total', 0)} ({children.get('active', 0)} active)") or None,
        ),
        ("Created", meta.get("creationTimestamp")),
    ]
    conditions = "".join(
        f"<tr><td>{esc(c.get('type'))}</td><td>{esc(c.get('status'))}</td><td>{esc(c.get('reason'))}</td>"
        f'<td class="wrap">{esc(c.get("message"))}</td><td>{esc(c.get("lastTransitionTime"))}</td></tr>'
        for c in status.get("conditions") or []
        if isinstance(c, Mapping)
    )
    table = (
        '<table class="conditions"><caption>Conditions</caption><thead><tr><th scope="col">Type</th>'
        '<th scope="col">Status</th><th scope="col">Reason</th><th scope="col">Message</th>'
        f'<th scope="col">Since</th></tr></thead><tbody>{conditions}</tbody></table>'
        if conditions
        else ""
    )
    return (
        f'<section id="summary" aria-label="Summary"><dl class="summary">{definitions(pairs)}</dl>'
        f"{table}</section>"
    )


def approvals(run: Mapping[str, Any], csrf: str) -> str:
    """The calls waiting for a decision, each with approve and deny (the server's RBAC and admission
    policy judge whether this person may decide)."""
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    pending = [p for p in status.get("pendingApprovals") or [] if isinstance(p, Mapping)]
    if not pending:
        return '<section id="approvals" aria-label="Approvals"></section>'
    action = esc(run_link(str(meta.get("namespace", "")), str(meta.get("name", ""))) + "/decisions")
    forms = []
    for call in pending:
        tool_input = json.dumps(call.get("input") or {}, indent=2, ensure_ascii=False)
        forms.append(
            f'<form method="post" action="{action}" class="approval">'
            f"<h3>{esc(call.get('toolName'))} <code>{esc(call.get('toolUseId'))}</code></h3>"
            f"<p>Waiting since {esc(call.get('since'))}</p><pre>{esc(tool_input)}</pre>"
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<input type="hidden" name="toolUseId" value="{esc(call.get("toolUseId"))}">'
            '<label>Reason <input name="reason" maxlength="500"></label>'
            '<button type="submit" name="decision" value="approve">Approve</button>'
            '<button type="submit" name="decision" value="deny" class="deny">Deny</button></form>'
        )
    return (
        '<section id="approvals" aria-label="Approvals"><h2>Waiting for approval</h2>'
        f"{''.join(forms)}</section>"
    )


def trace(rows: Sequence[TraceRow], progress: Sequence[Progress] = ()) -> str:
    """One line per model request, as a timeline of iterations."""
    if not rows:
        return '<section id="trace" aria-label="Trace"></section>'
    lines = []
    for row in rows:
        u = row.usage
        calls = ", ".join(
            f"{c.name} {'ok' if c.ok else (c.error_code or 'error')} {c.duration_seconds * 1000:.0f} ms"
            for c in row.tool_calls
        )
        lines.append(
            f'<tr><td class="num">{row.iteration}</td><td>{esc(row.stop_reason)}</td>'
            f'<td class="num">{"–" if row.model_seconds is None else f"{row.model_seconds:.2f} s"}</td>'
            f"<td>{esc(row.model)}</td>"
            f'<td class="num">{u.input_tokens}</td><td class="num">{u.output_tokens}</td>'
            f'<td class="num">{u.cache_read_input_tokens}</td><td>{esc(calls or "–")}</td></tr>'
        )
    return (
        f'<section id="trace" aria-label="Trace"><h2>Trace</h2>{timeline(rows)}{usage_chart(progress)}'
        '<table class="trace"><thead><tr>'
        '<th scope="col">Iteration</th><th scope="col">Stop reason</th><th scope="col">Answered in</th>'
        '<th scope="col">Model</th>'
        '<th scope="col">In</th><th scope="col">Out</th><th scope="col">Cache read</th>'
        f'<th scope="col">Tools</th></tr></thead><tbody>{"".join(lines)}</tbody></table></section>'
    )


def _folded(text: str, label: str, whole: str | None) -> str:
    """Short text as it is; long text folded, and on a run's page only its start, with a link to the
    turn's own page (``whole``) that shows all of it: a run of hundreds of turns with large tool results
    stays a page a browser opens at once."""
    if len(text) <= FOLD_CHARS:
        return f"<pre>{esc(text)}</pre>"
    summary = f"<summary>{esc(label)} ({size(text)})</summary>"
    if whole is None:
        return f"<details>{summary}<pre>{esc(text)}</pre></details>"
    return (
        f"<details>{summary}<pre>{esc(text[:FOLD_CHARS])}…</pre>"
        f'<p><a href="{esc(whole)}">The whole {esc(label)}</a></p></details>'
    )


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) if isinstance(b, Mapping) else str(b) for b in content)
    return json.dumps(content, ensure_ascii=False)


def _block(
    block: Mapping[str, Any], names: dict[str, str], whole: str | None, sent_cleared: bool = False
) -> str:
    kind = block.get("type")
    if kind == "text":
        return f'<div class="text">{_folded(str(block.get("text", "")), "text", whole)}</div>'
    if kind == "tool_use":
        names[str(block.get("id", ""))] = str(block.get("name", ""))
        text = json.dumps(block.get("input", {}), indent=2, ensure_ascii=False)
        return (
            f'<div class="call"><p>→ call <strong>{esc(block.get("name"))}</strong> '
            f'<code>{esc(block.get("id"))}</code> <span class="size">input {size(text)}</span></p>'
            f"{_folded(text, 'input', whole)}</div>"
        )
    if kind == "tool_result":
        text = _result_text(block.get("content"))
        label = "error" if block.get("is_error") else "result"
        tool_id = str(block.get("tool_use_id", ""))
        marker = (
            ' <span class="cleared-note">cleared: the model is now sent a marker in its place</span>'
            if sent_cleared
            else ""
        )
        return (
            f'<div class="result {label}{" cleared" if sent_cleared else ""}"><p>← {label} of '
            f"<strong>{esc(names.get(tool_id, '?'))}</strong> "
            f'<code>{esc(tool_id)}</code> <span class="size">{size(text)}</span>{marker}</p>'
            f"{_folded(text, label, whole)}</div>"
        )
    if kind in ("thinking", "redacted_thinking"):
        text = str(block.get("thinking", "")) if kind == "thinking" else "(redacted)"
        return (
            f'<details class="thinking"><summary>thinking ({size(text)})</summary>'
            f"<pre>{esc(text)}</pre></details>"
        )
    return f'<div class="other"><p>[{esc(kind)}]</p></div>'


def turn(
    number: int,
    message: Mapping[str, Any],
    names: dict[str, str],
    whole: str | None,
    sent_cleared: frozenset[int] = frozenset(),
) -> str:
    """One message of the conversation; ``names`` maps tool_use ids seen so far to their tools;
    ``sent_cleared`` the indexes of its blocks the model is sent as a marker."""
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    rendered = "".join(
        _block(b, names, whole, i in sent_cleared) for i, b in enumerate(blocks) if isinstance(b, Mapping)
    )
    role = str(message.get("role", "?"))
    return (
        f'<article class="turn {esc(role)}" id="turn-{number}"><h3>[{number}] {esc(role)}</h3>'
        f"{rendered}</article>"
    )


def transcript(stored: Transcript, *, note: str | None = None, run: Mapping[str, Any] | None = None) -> str:
    """The conversation as stored, marked with what the model is sent of it: each turn numbered (long
    parts cut short, the whole on the turn's own page), the turns a compaction summarized and the tool
    results sent as a marker (sent_views.py)."""
    meta = (run or {}).get("metadata") or {}
    link = run_link(str(meta.get("namespace", "")), str(meta.get("name", ""))) if run else ""
    marks = cleared_results(run, stored.messages, stored.state) if run else set()
    if note is not None:
        return (
            '<section id="transcript" aria-label="Transcript"><h2>Transcript</h2>'
            f'<p class="note">{esc(note)}</p></section>'
        )
    names: dict[str, str] = {}
    context = stored.state.get("context") or {}
    compaction = context.get("compaction") if isinstance(context.get("compaction"), Mapping) else None
    boundary = int(compaction.get("boundary") or 0) if compaction else 0
    turns = []
    for number, message in enumerate(stored.messages, start=1):
        if compaction and number == boundary + 1:
            turns.append(_summary_turn(compaction))
        sent_cleared = frozenset(index for n, index in marks if n == number)
        rendered = turn(number, message, names, f"{link}/turns/{number}", sent_cleared)
        if 1 < number <= boundary:  # the task (turn 1) is always sent
            rendered = rendered.replace('<article class="turn ', '<article class="turn summarized ', 1)
        turns.append(rendered)
    compactions = len(context.get("log") or [])
    marker = (
        f'<p class="compacted">Context compacted {compactions} time(s): the turns marked "summarized" '
        "are no longer sent to the model; the latest summary is sent in their place.</p>"
        if compactions
        else ""
    )
    empty = "" if turns else "<p>No turn stored yet.</p>"
    return (
        f'<section id="transcript" aria-label="Transcript"><h2>Transcript</h2>{marker}{empty}'
        f"{''.join(turns)}</section>"
    )


def _summary_turn(compaction: Mapping[str, Any]) -> str:
    """What the model is sent instead of the summarized turns (the latest compaction)."""
    return (
        '<article class="turn compaction"><h3>Compaction summary: sent in place of '
        f"{esc(compaction.get('turns'))} turns since iteration {esc(compaction.get('iteration'))} "
        f"(about {esc(compaction.get('tokensBefore'))} → {esc(compaction.get('tokensAfter'))} input tokens)"
        f"</h3><pre>{esc(compaction.get('summary'))}</pre></article>"
    )


def _line(values: Sequence[float], colour: str) -> str:
    top = max(values) or 1.0
    points = " ".join(
        f"{i * 600 / (len(values) - 1):.1f},{120 - value * 110 / top:.1f}" for i, value in enumerate(values)
    )
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'


def timeline(rows: Sequence[TraceRow]) -> str:
    """Where the run's time went, request by request: each model answer (blue) then its tools (green,
    the longest of a turn's calls: they run at once), end to end on one strip, each part titled with its
    iteration and length. Waits between them (approvals, quota room) are not in it."""
    parts: list[tuple[float, str, str]] = []
    for row in rows:
        if row.model_seconds is not None:
            parts.append(
                (row.model_seconds, "#2457c5", f"iteration {row.iteration}: model {row.model_seconds:.2f} s")
            )
        if row.tool_calls:
            longest = max(t.duration_seconds for t in row.tool_calls)
            names = ", ".join(t.name for t in row.tool_calls)
            parts.append((longest, "#1f7a3a", f"iteration {row.iteration}: {names} {longest:.2f} s"))
    total = sum(seconds for seconds, _, _ in parts)
    if not parts or total <= 0:
        return ""
    x, bars = 0.0, []
    for seconds, colour, title in parts:
        width = seconds * 600 / total
        bars.append(
            f'<rect x="{x:.2f}" y="4" width="{max(width, 0.5):.2f}" height="24" fill="{colour}">'
            f"<title>{esc(title)}</title></rect>"
        )
        x += width
    return (
        '<figure class="timeline"><svg role="img" viewBox="0 0 600 44" width="100%" height="44" '
        f'aria-label="Timeline: {total:.1f} s of model answers and tool calls over {len(rows)} requests">'
        f'{"".join(bars)}<text x="0" y="42" font-size="10">0 s</text>'
        f'<text x="600" y="42" font-size="10" text-anchor="end">{total:.1f} s</text></svg>'
        "<figcaption>Timeline: model answers (blue) and tool calls (green), request by request; hover a part "
        "for its iteration and length</figcaption></figure>"
    )


def usage_chart(progress: Sequence[Progress]) -> str:
    """Tokens and spend over the run, at each stored checkpoint, drawn on the server as an inline SVG
    (no script, no external asset); each line is scaled to its own maximum."""
    if len(progress) < 2:
        return ""
    tokens = [float(p.usage.total) for p in progress]
    costs = [float(p.cost_usd or 0) for p in progress]
    spent = progress[-1].cost_usd
    label = f"{int(tokens[-1])} tokens" + (f", ${spent:.4f}" if spent is not None else "")
    cost_line = _line(costs, "#c2410c") if spent else ""
    return (
        '<figure class="usage-chart"><svg role="img" viewBox="0 0 600 140" width="100%" height="140" '
        f'aria-label="Usage over {len(progress)} checkpoints: {label}">'
        f"{_line(tokens, '#2457c5')}{cost_line}"
        '<text x="0" y="136" font-size="10">first checkpoint</text>'
        f'<text x="600" y="136" font-size="10" text-anchor="end">checkpoint {len(progress)}</text>'
        f'<text x="4" y="10" font-size="10">{esc(label)}</text></svg>'
        "<figcaption>Tokens (blue) and spend (orange) so far, checkpoint by checkpoint</figcaption></figure>"
    )


def whole_turn(run: Mapping[str, Any], stored: Transcript, number: int) -> str:
    """One turn with nothing cut short (the tool names of earlier calls resolved)."""
    meta = run.get("metadata") or {}
    link = run_link(str(meta.get("namespace", "")), str(meta.get("name", "")))
    names: dict[str, str] = {}
    for message in stored.messages[: number - 1]:
        for block in message.get("content") or [] if not isinstance(message.get("content"), str) else []:
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                names[str(block.get("id", ""))] = str(block.get("name", ""))
    body = turn(number, stored.messages[number - 1], names, None)
    return f'<p><a href="{esc(link)}#turn-{number}">Back to {esc(meta.get("name"))}</a></p>{body}'


def run_page_body(
    run: Mapping[str, Any], stored: Transcript, csrf: str, *, note: str | None = None, children: str = ""
) -> str:
    meta = run.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    live = esc(run_link(namespace, name).replace("/runs/", "/live/runs/", 1))
    return (
        f'<div id="run" data-live="{live}" data-resource-version="{esc(meta.get("resourceVersion", ""))}">'
        f"<h1>{esc(name)} <small>{esc(namespace)}</small></h1>"
        f"{approvals(run, csrf)}{summary(run)}{children}{trace(stored.trace_rows, stored.progress_by_record)}"
        f"{transcript(stored, note=note, run=run)}</div>"
    )
