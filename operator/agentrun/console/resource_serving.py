"""Routes of the Agents, schedules and quotas pages: each one LIST as the person (two for quotas: the
quotas and the namespace's runs, for the line of runs waiting)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agentrun.api import AGENT_PLURAL, API_VERSION, LABEL_AGENT, QUOTA_PLURAL, SCHEDULE_PLURAL
from agentrun.console import resource_views, views
from agentrun.console.run_serving import runs_path
from agentrun.console.serving import session_of
from agentrun.kube.errors import APIError

if TYPE_CHECKING:
    from agentrun.console.serving import Console
    from agentrun.console.sessions import Session


def path_of(plural: str, namespace: str) -> str:
    return f"/apis/{API_VERSION}" + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"


class ResourcePages:
    def __init__(self, console: Console) -> None:
        self.console = console

    def _namespace(self, request: web.Request) -> str:
        return request.query.get("namespace", self.console.config.namespace).strip()

    async def _list(
        self, session: Session, plural: str, namespace: str, **params: str
    ) -> list[dict[str, Any]]:
        path = runs_path(namespace) if plural == "agentruns" else path_of(plural, namespace)
        listing = await self.console.api.request(session.identity, "GET", path, params=params or None)
        return list(listing.get("items") or [])

    def _page(self, session: Session, title: str, action: str, namespace: str, body: str) -> web.Response:
        text = views.page(
            title,
            resource_views.namespace_form(action, namespace) + body,
            who=session.identity.label,
            csrf=session.csrf,
        )
        return web.Response(text=text, content_type="text/html")

    async def agents(self, request: web.Request) -> web.Response:
        session, namespace = session_of(request), self._namespace(request)
        try:
            items = await self._list(session, AGENT_PLURAL, namespace)
            runs = await self._list(session, "agentruns", namespace, labelSelector=LABEL_AGENT)
        except APIError as exc:
            return self.console.api_problem(exc, "cannot list Agents and their runs", session)
        counts = Counter(
            ((r["metadata"].get("namespace", ""), r["metadata"].get("labels", {}).get(LABEL_AGENT, "")))
            for r in runs
        )
        return self._page(session, "Agents", "/agents", namespace, resource_views.agents(items, counts))

    async def schedules(self, request: web.Request) -> web.Response:
        session, namespace = session_of(request), self._namespace(request)
        try:
            items = await self._list(session, SCHEDULE_PLURAL, namespace)
        except APIError as exc:
            return self.console.api_problem(exc, "cannot list AgentSchedules", session)
        return self._page(session, "Schedules", "/schedules", namespace, resource_views.schedules(items))

    async def quotas(self, request: web.Request) -> web.Response:
        session, namespace = session_of(request), self._namespace(request)
        try:
            items = await self._list(session, QUOTA_PLURAL, namespace)
            runs = await self._list(session, "agentruns", namespace) if items else []
        except APIError as exc:
            return self.console.api_problem(exc, "cannot list AgentRunQuotas and the runs waiting", session)
        body = resource_views.quotas(items, resource_views.in_line_order(runs))
        return self._page(session, "Quotas", "/quotas", namespace, body)


def add_routes(app: web.Application, console: Console) -> None:
    pages = ResourcePages(console)
    app.router.add_get("/agents", pages.agents)
    app.router.add_get("/schedules", pages.schedules)
    app.router.add_get("/quotas", pages.quotas)
