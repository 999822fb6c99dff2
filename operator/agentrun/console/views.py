"""The console's pages as HTML, rendered on the server (no template engine, no external asset).

Every value from the API server is escaped here (`esc`), the one place text enters the markup. Live
parts have ids the page's script (static/console.js) swaps when the server sends a new rendering.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

PAGES = (("/", "Runs"), ("/agents", "Agents"), ("/schedules", "Schedules"), ("/quotas", "Quotas"))
NAV = "".join(f'<a href="{path}">{label}</a>' for path, label in PAGES)
PHASES = ("Pending", "Running", "AwaitingApproval", "Succeeded", "Failed", "Cancelled")


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def page(title: str, body: str, *, who: str | None = None, csrf: str | None = None) -> str:
    """A whole page: the header names who the API server sees (or offers to sign in)."""
    header = ""
    if who is not None:
        signout = (
            f'<form method="post" action="/logout" class="inline"><input type="hidden" name="csrf" '
            f'value="{esc(csrf)}"><button type="submit">Sign out</button></form>'
            if csrf
            else ""
        )
        header = f'<span class="who">Signed in as <strong>{esc(who)}</strong></span>{signout}'
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · agentrun console</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="/static/console.css"><script src="/static/console.js" defer></script>'
        '</head><body><header class="top"><a class="brand" href="/">agentrun console</a>'
        f'<nav>{NAV}</nav>{header}</header><main id="main">{body}</main></body></html>\n'
    )


def login(error: str | None = None) -> str:
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return page(
        "Sign in",
        "<h1>Sign in</h1>"
        "<p>Paste a bearer token the API server accepts as you (for example the output of "
        "<code>kubectl create token NAME</code>). The console acts as you with it; Kubernetes RBAC "
        "decides what you see and may do. It is kept in this console's memory only.</p>"
        f'{problem}<form method="post" action="/login" class="login">'
        '<label for="token">Token</label>'
        '<input id="token" name="token" type="password" autocomplete="off" required autofocus>'
        '<button type="submit">Sign in</button></form>',
    )


def problem(status: int, message: str, *, who: str | None = None, csrf: str | None = None) -> str:
    return page(
        f"HTTP {status}",
        f'<h1>{esc(status_title(status))}</h1><p class="error" role="alert">{esc(message)}</p>'
        '<p><a href="/">Back to the runs</a></p>',
        who=who,
        csrf=csrf,
    )


def status_title(status: int) -> str:
    return {401: "Not signed in", 403: "Not allowed", 404: "Not found"}.get(status, "Something went wrong")


# The runs list ------------------------------------------------------------------------------------


def run_link(namespace: str, name: str) -> str:
    return f"/runs/{quote(namespace, safe='')}/{quote(name, safe='')}"


def cost_of(status: Mapping[str, Any]) -> str:
    cost = (status.get("usage") or {}).get("costUSD")
    return f"${float(cost):.4f}" if cost not in (None, "") else "–"


def run_row(run: Mapping[str, Any]) -> str:
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    spec = run.get("spec") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    phase = str(status.get("phase") or "Pending")
    tokens = (status.get("usage") or {}).get("totalTokens", 0)
    agent = (spec.get("agentRef") or {}).get("name", "")
    return (
        f'<tr id="run-{esc(meta.get("uid"))}" data-phase="{esc(phase)}">'
        f'<td><a href="{esc(run_link(namespace, name))}">{esc(name)}</a></td>'
        f"<td>{esc(namespace)}</td>"
        f'<td><span class="phase phase-{esc(phase.lower())}">{esc(phase)}</span></td>'
        f"<td>{esc(status.get('stopReason') or '')}</td>"
        f"<td>{esc(agent)}</td>"
        f'<td class="num">{esc(status.get("iterations", 0))}</td>'
        f'<td class="num">{esc(tokens)}</td>'
        f'<td class="num">{esc(cost_of(status))}</td>'
        f"<td>{esc(meta.get('creationTimestamp', ''))}</td></tr>"
    )


def runs(
    items: Sequence[Mapping[str, Any]],
    *,
    filters: Mapping[str, str],
    next_page: str | None,
    resource_version: str,
    live_query: str,
    refused: str | None = None,
) -> str:
    """The runs table (newest first) with its filters; ``live_query`` is the stream's query string.
    ``refused``: why the API server listed nothing (the filters stay, to pick a namespace one may read)."""
    options = "".join(
        f'<option value="{p}"{" selected" if filters.get("phase") == p else ""}>{p}</option>' for p in PHASES
    )
    form = (
        '<form method="get" action="/" class="filters" aria-label="Filter runs">'
        f'<label>Namespace <input name="namespace" value="{esc(filters.get("namespace", ""))}" '
        'placeholder="all namespaces"></label>'
        f'<label>Phase <select name="phase"><option value="">any</option>{options}</select></label>'
        f'<label>Stop reason <input name="stopReason" value="{esc(filters.get("stopReason", ""))}"></label>'
        f'<label>Agent <input name="agent" value="{esc(filters.get("agent", ""))}"></label>'
        f'<label>Schedule <input name="schedule" value="{esc(filters.get("schedule", ""))}"></label>'
        '<button type="submit">Filter</button></form>'
    )
    if refused is not None:
        return f'<h1>Runs</h1>{form}<p class="error" role="alert">{esc(refused)}</p>'
    rows = "".join(run_row(r) for r in items)
    empty = "" if items else '<p class="empty" id="no-runs">No runs match.</p>'
    more = ""
    if next_page:
        query = urlencode({**{k: v for k, v in filters.items() if v}, "continue": next_page})
        more = f'<p><a class="next" href="/?{esc(query)}" rel="next">Next page</a></p>'
    return (
        f"<h1>Runs</h1>{form}"
        f'<table class="runs" id="runs" data-live="/live/runs?{esc(live_query)}" '
        f'data-resource-version="{esc(resource_version)}"><thead><tr><th scope="col">Name</th>'
        '<th scope="col">Namespace</th><th scope="col">Phase</th><th scope="col">Stop reason</th>'
        '<th scope="col">Agent</th><th scope="col">Iterations</th><th scope="col">Tokens</th>'
        f'<th scope="col">Cost</th><th scope="col">Created</th></tr></thead><tbody>{rows}</tbody></table>'
        f"{empty}{more}"
    )


def definitions(pairs: Iterable[tuple[str, object]]) -> str:
    return "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs if v not in (None, ""))
