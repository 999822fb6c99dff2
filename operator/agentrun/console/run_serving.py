"""The pages: the runs list (paged from the API server), one run, and decisions on its approvals.

Every read and write is the person's (`Console.api` with the session's identity): what RBAC refuses
them is shown as the API server words it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from agentrun.api import API_VERSION, LABEL_AGENT, LABEL_PARENT_UID, LABEL_SCHEDULE
from agentrun.api.transcripts import (
    POSTGRES_KIND,
    Transcript,
    TranscriptError,
    chunk_selector,
    decode_chunks,
    decode_objects,
    object_kind,
    storage_of,
)
from agentrun.cli.plugin_approving import appending, decision_entry
from agentrun.cli.plugin_rendering import run_tree
from agentrun.console import resource_views, run_views, views
from agentrun.console.identities import Identity
from agentrun.console.serving import form_value, may, see_other, session_of, who_is
from agentrun.kube.calling import JSON_PATCH
from agentrun.kube.errors import APIConflictError, APIError, APIInvalidError, APIStatusError
from agentrun.stores.postgres import UNAVAILABLE

if TYPE_CHECKING:
    from agentrun.console.serving import Console
    from agentrun.console.sessions import Session

CONFLICT_RETRIES = 5
FILTERS = ("namespace", "phase", "stopReason", "agent", "schedule")


def runs_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{API_VERSION}" + (f"/namespaces/{namespace}" if namespace else "") + "/agentruns"
    return f"{base}/{name}" if name else base


def matches(run: Mapping[str, Any], filters: Mapping[str, str]) -> bool:
    """The filters the API server cannot apply to a custom resource's status (phase, stop reason)."""
    status = run.get("status") or {}
    if filters.get("phase") and (status.get("phase") or "Pending") != filters["phase"]:
        return False
    return not (filters.get("stopReason") and status.get("stopReason") != filters["stopReason"])


def list_params(filters: Mapping[str, str]) -> dict[str, str]:
    """The filters the API server applies: labels the operator sets on runs of an Agent or a schedule."""
    selectors = [
        f"{label}={filters[key]}"
        for key, label in (("agent", LABEL_AGENT), ("schedule", LABEL_SCHEDULE))
        if filters.get(key)
    ]
    return {"labelSelector": ",".join(selectors)} if selectors else {}


class RunPages:
    def __init__(self, console: Console) -> None:
        self.console = console

    def page(self, body: str, title: str, session: Session, *, status: int = 200) -> web.Response:
        text = views.page(title, body, who=session.identity.label, csrf=session.csrf)
        return web.Response(status=status, text=text, content_type="text/html")

    async def runs(self, request: web.Request) -> web.Response:
        console, session, query = self.console, session_of(request), request.query
        filters = {
            k: query.get(k, console.config.namespace if k == "namespace" else "").strip() for k in FILTERS
        }
        params = {**list_params(filters), "limit": str(console.config.page_size)}
        if query.get("continue"):
            params["continue"] = query["continue"]
        namespace = filters["namespace"]
        where = f"agentruns in namespace {namespace}" if namespace else "agentruns in all namespaces"
        try:
            listing = await console.api.request(session.identity, "GET", runs_path(namespace), params=params)
        except APIStatusError as exc:
            if exc.status not in (403, 404):
                return console.api_problem(exc, f"cannot list {where}", session)
            hint = "" if namespace else "; choose a namespace you may read"
            body = views.runs(
                [],
                filters=filters,
                next_page=None,
                resource_version="",
                live_query="",
                refused=f"You may not list {where}: {exc}{hint}",
            )
            return self.page(body, "Runs", session, status=exc.status)
        except APIError as exc:
            return console.api_problem(exc, f"cannot list {where}", session)
        items = [r for r in listing.get("items") or [] if matches(r, filters)]
        items.sort(key=lambda r: (r.get("metadata") or {}).get("creationTimestamp", ""), reverse=True)
        meta = listing.get("metadata") or {}
        body = views.runs(
            items,
            filters=filters,
            next_page=meta.get("continue") or None,
            resource_version=str(meta.get("resourceVersion", "")),
            live_query=urlencode({k: v for k, v in filters.items() if v}),
        )
        return self.page(body, "Runs", session)

    async def _read(
        self, request: web.Request
    ) -> tuple[dict[str, Any], Transcript, str | None] | web.Response:
        """The run of the request's path and its transcript, read as the person; or the refusal shown."""
        console, session = self.console, session_of(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            obj = await console.api.request(session.identity, "GET", runs_path(namespace, name))
        except APIError as exc:
            return console.api_problem(exc, f"cannot read agentrun {namespace}/{name}", session)
        stored, note = await read_transcript(console, session.identity, obj)
        return obj, stored, note

    async def run(self, request: web.Request) -> web.Response:
        read = await self._read(request)
        if isinstance(read, web.Response):
            return read
        (obj, stored, note), session = read, session_of(request)
        children = await self._children(session, obj)
        body = run_views.run_page_body(obj, stored, session.csrf, note=note, children=children)
        return self.page(body, request.match_info["name"], session)

    async def _children(self, session: Session, run: Mapping[str, Any]) -> str:
        """The run's children and theirs (one LIST of the namespace's child runs), when it has any."""
        if not (run.get("status") or {}).get("children"):
            return ""
        namespace = str(run["metadata"].get("namespace", ""))
        try:
            listing = await self.console.api.request(
                session.identity, "GET", runs_path(namespace), params={"labelSelector": LABEL_PARENT_UID}
            )
        except APIError:
            return ""  # the run is shown; its children are refused on their own pages
        return resource_views.children(run_tree(run, listing.get("items") or []))

    async def whole_turn(self, request: web.Request) -> web.Response:
        read = await self._read(request)
        if isinstance(read, web.Response):
            return read
        (obj, stored, note), session, console = read, session_of(request), self.console
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        number = int(request.match_info["number"])
        if note is not None or not 1 <= number <= len(stored.messages):
            return console.problem(404, note or f"agentrun {namespace}/{name} has no turn {number}", session)
        return self.page(run_views.whole_turn(obj, stored, number), f"{name}, turn {number}", session)

    async def decide(self, request: web.Request) -> web.StreamResponse:
        console, session = self.console, session_of(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        form = await request.post()
        decision = form_value(form, "decision")
        if decision not in ("approve", "deny"):
            return console.problem(400, "the decision must be approve or deny", session)
        call, reason = form_value(form, "toolUseId"), form_value(form, "reason")
        try:
            await record_decision(console, session.identity, namespace, name, call, decision, reason)
        except DecisionRefused as exc:
            return console.problem(exc.status, str(exc), session)
        except APIError as exc:
            return console.api_problem(exc, f"cannot decide on agentrun {namespace}/{name}", session)
        return see_other(views.run_link(namespace, name))


def add_routes(app: web.Application, console: Console) -> None:
    pages = RunPages(console)
    app.router.add_get("/", pages.runs)
    app.router.add_get("/runs/{namespace}/{name}", pages.run)
    app.router.add_get(r"/runs/{namespace}/{name}/turns/{number:\d{1,7}}", pages.whole_turn)
    app.router.add_post("/runs/{namespace}/{name}/decisions", pages.decide)


async def read_transcript(
    console: Console, identity: Identity, run: Mapping[str, Any]
) -> tuple[Transcript, str | None]:
    """The run's stored transcript as this person may read it, or a note saying why it is not shown."""
    meta, status = run.get("metadata") or {}, run.get("status") or {}
    ref = status.get("transcript") or {}
    if ref.get("kind") == POSTGRES_KIND:
        return await read_rows(console, identity, run)
    storage = storage_of(ref.get("kind"))
    params = {"labelSelector": chunk_selector(uid=str(meta.get("uid", "")))}
    path = f"/api/v1/namespaces/{meta.get('namespace')}/{'secrets' if storage == 'secret' else 'configmaps'}"
    try:
        listing = await console.api.request(identity, "GET", path, params=params)
    except APIStatusError as exc:
        return Transcript(), f"You may not read this run's transcript ({object_kind(storage)}s): {exc}"
    kind = object_kind(storage)
    try:
        return decode_objects([{**item, "kind": kind} for item in listing.get("items") or []]), None
    except TranscriptError as exc:
        return Transcript(), f"The stored transcript cannot be read: {exc}"


async def read_rows(
    console: Console, identity: Identity, run: Mapping[str, Any]
) -> tuple[Transcript, str | None]:
    """A transcript kept in PostgreSQL, for a person the API server lets list the namespace's Secrets:
    the right that reads a transcript kept in Secrets, so the store does not change who may read it."""
    meta = run.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    database = await console.database()
    if database is None:
        return Transcript(), (
            "This run's transcript is kept in PostgreSQL and this console has no database configured "
            "(--database-url): read it with "
            f"`kubectl agentrun transcript {meta.get('name')} --database-url ...`."
        )
    try:
        allowed = await may(console.api, identity, "list", "secrets", namespace)
    except APIError as exc:
        return Transcript(), f"The API server cannot tell whether you may read this transcript: {exc}"
    if not allowed:
        return Transcript(), (
            f"You may not read this run's transcript: it takes `list` on secrets in namespace {namespace}."
        )
    try:
        return decode_chunks(await database.read_chunks(str(meta.get("uid", "")))), None
    except UNAVAILABLE as exc:
        return Transcript(), f"The transcript database cannot be reached ({type(exc).__name__}); try again."
    except TranscriptError as exc:
        return Transcript(), f"The stored transcript cannot be read: {exc}"


class DecisionRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def record_decision(
    console: Console,
    identity: Identity,
    namespace: str,
    name: str,
    tool_use_id: str,
    decision: str,
    reason: str,
) -> None:
    """Appends the decision to spec.approvals as this person, guarded by resourceVersion (two deciders
    never clobber each other); ``by`` is the name the API server gives them, which the chart's admission
    policy checks."""
    by = identity.label if (identity.bearer or identity.user) else None
    by = by or await _who(console, identity)
    for _ in range(CONFLICT_RETRIES):
        run = await console.api.request(identity, "GET", runs_path(namespace, name))
        pending = {p.get("toolUseId") for p in (run.get("status") or {}).get("pendingApprovals") or []}
        if tool_use_id not in pending:
            raise DecisionRefused(
                409, f"{tool_use_id or 'that call'} is not waiting for a decision (any more)"
            )
        patch = appending(run, decision_entry(tool_use_id, decision, by, reason))
        try:
            await console.api.request(
                identity, "PATCH", runs_path(namespace, name), body=patch, content_type=JSON_PATCH
            )
            return
        except (APIConflictError, APIInvalidError) as exc:
            again = await console.api.request(identity, "GET", runs_path(namespace, name))
            if again["metadata"]["resourceVersion"] == run["metadata"]["resourceVersion"]:
                raise DecisionRefused(
                    exc.status or 422, f"the API server refused the decision: {exc}"
                ) from exc
    raise DecisionRefused(409, f"agentrun {namespace}/{name} kept changing; try again")


async def _who(console: Console, identity: Identity) -> str:
    name = await who_is(console.api, identity)
    if name is None:
        raise DecisionRefused(
            400, "the API server's SelfSubjectReview names nobody: cannot record who decided"
        )
    return name
