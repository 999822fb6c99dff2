"""The pages beside the runs: Agents, schedules, quotas (with the runs waiting in their line), and a
run's children as a tree. Rendered like views.py: every value escaped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from agentrun.cli.plugin_rendering import RunNode
from agentrun.console.views import cost_of, esc, run_link

SUMMARY_KEYS = (
    ("concurrentRuns", "Runs at once"),
    ("runs", "Runs"),
    ("tokens", "Tokens"),
    ("costUSD", "Cost (USD)"),
    ("concurrentSandboxes", "Sandboxes at once"),
    ("sandboxCPU", "Sandbox CPU"),
    ("sandboxMemory", "Sandbox memory"),
)


def namespace_form(action: str, namespace: str) -> str:
    return (
        f'<form method="get" action="{esc(action)}" class="filters" aria-label="Namespace">'
        f'<label>Namespace <input name="namespace" value="{esc(namespace)}" placeholder="all namespaces">'
        '</label><button type="submit">Show</button></form>'
    )


def _table(caption: str, headers: Sequence[str], rows: Sequence[str], empty: str) -> str:
    if not rows:
        return f'<p class="empty">{esc(empty)}</p>'
    head = "".join(f'<th scope="col">{esc(h)}</th>' for h in headers)
    return (
        f'<table><caption class="sr">{esc(caption)}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _runs_of(namespace: str, **filters: str) -> str:
    return "/?" + urlencode({"namespace": namespace, **filters})


def _condition(obj: Mapping[str, Any], kind: str) -> str:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return f"{condition.get('status')} ({condition.get('reason') or ''})"
    return "–"


def agents(items: Sequence[Mapping[str, Any]], runs_by_agent: Mapping[tuple[str, str], int]) -> str:
    rows = []
    for agent in items:
        meta, spec = agent.get("metadata") or {}, agent.get("spec") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        model = (spec.get("model") or {}).get("name", "")
        count = runs_by_agent.get((namespace, name), 0)
        rows.append(
            f"<tr><td>{esc(name)}</td><td>{esc(namespace)}</td><td>{esc(model)}</td>"
            f"<td>{esc(_condition(agent, 'Ready'))}</td>"
            f'<td class="num"><a href="{esc(_runs_of(namespace, agent=name))}">{count} runs</a></td></tr>'
        )
    headers = ("Agent", "Namespace", "Model", "Ready", "Runs")
    return "<h1>Agents</h1>" + _table("Agents", headers, rows, "No Agents here.")


def schedules(items: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for schedule in items:
        meta, spec, status = (
            schedule.get("metadata") or {},
            schedule.get("spec") or {},
            schedule.get("status") or {},
        )
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        rows.append(
            f"<tr><td>{esc(name)}</td><td>{esc(namespace)}</td><td><code>{esc(spec.get('schedule'))}</code></td>"
            f"<td>{esc(spec.get('timeZone') or 'UTC')}</td><td>{'yes' if spec.get('suspend') else 'no'}</td>"
            f"<td>{esc(status.get('nextScheduleTime') or '–')}</td>"
            f"<td>{esc(status.get('lastScheduleTime') or '–')}</td>"
            f'<td class="num"><a href="{esc(_runs_of(namespace, schedule=name))}">'
            f"{len(status.get('active') or [])} active</a></td></tr>"
        )
    headers = ("Schedule", "Namespace", "Cron", "Time zone", "Suspended", "Next run", "Last run", "Runs")
    return "<h1>Schedules</h1>" + _table("Schedules", headers, rows, "No schedules here.")


def quotas(items: Sequence[Mapping[str, Any]], waiting: Sequence[Mapping[str, Any]]) -> str:
    """Each quota's used against hard, then the runs waiting for room, in the order they will start."""
    sections = []
    for quota in items:
        meta, status = quota.get("metadata") or {}, quota.get("status") or {}
        summary = status.get("summary") or {}
        hard = (quota.get("spec") or {}).get("hard") or {}
        # Before the operator's first write the status has no summary: the limits, used not known yet.
        cells = "".join(
            f'<tr><th scope="row">{esc(label)}</th><td>{esc(summary.get(key) or f"–/{hard[key]}")}</td></tr>'
            for key, label in SUMMARY_KEYS
            if summary.get(key) or key in hard
        )
        name = str(meta.get("name", ""))
        line = [w for w in waiting if ((w.get("status") or {}).get("quotaWait") or {}).get("quota") == name]
        sections.append(
            f'<section class="quota" aria-label="Quota {esc(name)}"><h2>{esc(name)} '
            f"<small>{esc(meta.get('namespace'))}</small></h2>"
            f'<table class="usage"><caption>Used / hard</caption><tbody>{cells}</tbody></table>'
            f"{waiting_runs(line)}</section>"
        )
    return "<h1>Quotas</h1>" + ("".join(sections) or '<p class="empty">No quotas here.</p>')


def waiting_runs(line: Sequence[Mapping[str, Any]]) -> str:
    if not line:
        return "<p>No run is waiting.</p>"
    rows = []
    for position, run in enumerate(line, start=1):
        meta, status = run.get("metadata") or {}, run.get("status") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        wait = status.get("quotaWait") or {}
        rows.append(
            f'<tr><td class="num">{position}</td>'
            f'<td><a href="{esc(run_link(namespace, name))}">{esc(name)}</a></td>'
            f'<td class="num">{esc((run.get("spec") or {}).get("priority", 0))}</td>'
            f"<td>{esc(wait.get('limit'))}</td>"
            f'<td class="wrap">{esc(status.get("message"))}</td></tr>'
        )
    headers = ("Position", "Run", "Priority", "Waiting for", "Message")
    return "<h3>Waiting for room</h3>" + _table("Waiting runs", headers, rows, "")


def in_line_order(runs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Waiting runs as the quota admits them: higher spec.priority first, then older first."""
    waiting = [r for r in runs if (r.get("status") or {}).get("quotaWait")]
    return sorted(
        waiting,
        key=lambda r: (
            -int((r.get("spec") or {}).get("priority") or 0),
            (r.get("metadata") or {}).get("creationTimestamp", ""),
            (r.get("metadata") or {}).get("name", ""),
        ),
    )


def children(tree: RunNode) -> str:
    """A run's children and theirs, with each one's spend against its budget."""
    if not tree.children:
        return '<section id="children" aria-label="Children"></section>'
    return f'<section id="children" aria-label="Children"><h2>Children</h2>{_nodes(tree.children)}</section>'


def _nodes(nodes: Sequence[RunNode]) -> str:
    items = []
    for node in nodes:
        meta, spec, status = (
            node.run.get("metadata") or {},
            node.run.get("spec") or {},
            node.run.get("status") or {},
        )
        limits = spec.get("limits") or {}
        budget = f" of ${limits['costBudgetUSD']}" if limits.get("costBudgetUSD") else ""
        tokens = (status.get("usage") or {}).get("totalTokens", 0)
        token_budget = f" of {limits['tokenBudget']}" if limits.get("tokenBudget") else ""
        link = run_link(str(meta.get("namespace", "")), str(meta.get("name", "")))
        items.append(
            f'<li><a href="{esc(link)}">{esc(meta.get("name"))}</a> '
            f'<span class="phase phase-{esc(str(status.get("phase") or "Pending").lower())}">'
            f"{esc(status.get('phase') or 'Pending')}</span> "
            f"{esc(tokens)} tokens{esc(token_budget)}, {esc(cost_of(status))}{esc(budget)}"
            f"{_nodes(node.children) if node.children else ''}</li>"
        )
    return f'<ul class="tree">{"".join(items)}</ul>'
