"""Live pages: server-sent events from a watch the person makes (not polling).

The runs list gets each changed row rendered (``row``: {id, html}; an empty html removes it); a run's
page gets its sections (``section``: {id, html}), the trace and transcript read again (as the person)
when the run stored a new chunk. ``reload`` asks the page to load itself again (the watch's resource
version expired); ``gone`` says the run was deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agentrun.console import run_views, views
from agentrun.console.identities import Identity
from agentrun.console.run_serving import FILTERS, list_params, matches, read_transcript, runs_path
from agentrun.console.serving import session_of
from agentrun.kube.errors import APIError, APIGoneError

if TYPE_CHECKING:
    from agentrun.console.serving import Console
    from agentrun.console.sessions import Session

#: A comment line this often keeps proxies from closing a quiet stream.
HEARTBEAT_SECONDS = 20.0


class Stream:
    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response

    @classmethod
    async def open(cls, request: web.Request) -> Stream:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        return cls(response)

    async def send(self, event: str, data: Mapping[str, Any]) -> None:
        await self._response.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())

    async def heartbeat(self) -> None:
        await self._response.write(b": keep-alive\n\n")


async def events(
    console: Console, identity: Identity, path: str, params: dict[str, str], stream: Stream
) -> AsyncIterator[dict[str, Any]]:
    """Watch events from ``params['resourceVersion']`` on, watched again when the server ends a watch;
    heartbeats meanwhile. A resource version too old ends it with ``reload``."""
    while True:
        watch = console.api.watch(identity, path, params).__aiter__()
        step: asyncio.Future[dict[str, Any]] | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(watch))
                while not (await asyncio.wait({step}, timeout=HEARTBEAT_SECONDS))[0]:
                    await stream.heartbeat()
                try:
                    event = step.result()
                except StopAsyncIteration:
                    break
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        await stream.send("reload", {})
                        return
                    raise APIGoneError(str(obj.get("message") or "watch failed"), status=obj.get("code"))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    params["resourceVersion"] = str(version)
                if event.get("type") != "BOOKMARK":
                    yield event
        finally:
            # The person left (or the watch failed) while a read was pending: it holds the connection.
            if step is not None and not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await step
            with contextlib.suppress(Exception):
                await watch.aclose()  # type: ignore[attr-defined]


def add_routes(app: web.Application, console: Console) -> None:
    async def live_runs(request: web.Request) -> web.StreamResponse:
        session = session_of(request)
        filters = {k: request.query.get(k, "").strip() for k in FILTERS}
        params = {**list_params(filters), "resourceVersion": request.query.get("resourceVersion", "")}
        stream = await Stream.open(request)
        try:
            async for event in events(
                console, session.identity, runs_path(filters["namespace"]), params, stream
            ):
                run = event.get("object") or {}
                row_id = f"run-{(run.get('metadata') or {}).get('uid', '')}"
                shown = event.get("type") != "DELETED" and matches(run, filters)
                await stream.send("row", {"id": row_id, "html": views.run_row(run) if shown else ""})
        except (APIError, ConnectionResetError) as exc:
            await _ended(stream, exc)
        return stream._response

    async def live_run(request: web.Request) -> web.StreamResponse:
        session = session_of(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        params = {
            "fieldSelector": f"metadata.name={name}",
            "resourceVersion": request.query.get("resourceVersion", ""),
        }
        stream = await Stream.open(request)
        stored_chunks = None
        try:
            async for event in events(console, session.identity, runs_path(namespace), params, stream):
                run = event.get("object") or {}
                if event.get("type") == "DELETED":
                    await stream.send("gone", {})
                    break
                await stream.send("section", {"id": "summary", "html": run_views.summary(run)})
                await stream.send(
                    "section", {"id": "approvals", "html": run_views.approvals(run, session.csrf)}
                )
                chunks = ((run.get("status") or {}).get("transcript") or {}).get("chunks")
                if chunks != stored_chunks:
                    stored_chunks = chunks
                    await send_transcript(console, session, run, stream)
        except (APIError, ConnectionResetError) as exc:
            await _ended(stream, exc)
        return stream._response

    app.router.add_get("/live/runs", live_runs)
    app.router.add_get("/live/runs/{namespace}/{name}", live_run)


async def send_transcript(console: Console, session: Session, run: Mapping[str, Any], stream: Stream) -> None:
    """The trace and the transcript read again as the person (the run stored a new chunk)."""
    stored, note = await read_transcript(console, session.identity, run)
    trace = run_views.trace(stored.trace_rows, stored.progress_by_record)
    await stream.send("section", {"id": "trace", "html": trace})
    await stream.send(
        "section", {"id": "transcript", "html": run_views.transcript(stored, note=note, run=run)}
    )


async def _ended(stream: Stream, exc: BaseException) -> None:
    with contextlib.suppress(ConnectionResetError):
        await stream.send("ended", {"message": str(exc)})
