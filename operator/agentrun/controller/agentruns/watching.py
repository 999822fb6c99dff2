"""The operator's own list and watch of AgentRuns, in place of Kopf's.

Why: every status patch a run makes comes back as a watch event, and Kopf's processing of each event
(per-object queues and workers, cause detection, handler selection, its per-object logger and patch)
was 14% of the operator's CPU at 1000 runs, most of it for events our handler reads in microseconds
(docs/benchmarks.md, #32). Here an event is one JSON line decoded and handed on.

What it keeps of Kopf's watch: the initial listing delivered as events of type None, then a watch from
the listing's resourceVersion with bookmarks; a stream that ends is resumed from the last version seen;
an expired version (410 Gone) lists again; a failed connection or a refusal is retried with a growing
pause. Events reach ``deliver`` one at a time, in the order the API server sent them. A run that still
carries the finalizer earlier builds put on runs has it taken off, as Kopf did.

Namespace patterns (``team-*``) stay with Kopf, which resolves them by watching Namespaces
(controller/kopf_registry.py); with exact names or none, this watch serves the runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentrun import json_text
from agentrun.api import GROUP, PLURAL, VERSION
from agentrun.kube.calling import JSON_PATCH, KubeClient, call, opened
from agentrun.kube.errors import APIError, APIGoneError, refused, typed_errors

logger = logging.getLogger(__name__)

#: The finalizer runs made by builds with a Kopf daemon carry; nothing needs it now.
LEGACY_FINALIZER = "agentrun.dev/finalizer"
#: Runs per page of the listing.
PAGE = 500
#: Seconds a watch request stays open before the API server ends it (it is then resumed).
WATCH_SECONDS = 300
#: Pauses after a failure, growing to the last.
BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)

Deliver = Callable[[str | None, Mapping[str, Any]], Awaitable[None]]


class Expired(Exception):
    """The watch's resourceVersion is gone from the API server's history: list again."""


class RunWatch:
    def __init__(
        self,
        kube: KubeClient,
        namespaces: Sequence[str],
        deliver: Deliver,
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self._kube = kube
        self._namespaces: Sequence[str | None] = list(namespaces) or [None]
        self._deliver = deliver
        self._sleep = sleep
        self.listed = asyncio.Event()  # set once every namespace has been listed
        self._first_listed: set[str | None] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="agentrun watch")

    async def stop(self) -> None:
        """No event is delivered after this returns (shutdown: before the runs are closed)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """Until cancelled: one list-and-watch loop per namespace (one for all when none is named)."""
        async with asyncio.TaskGroup() as group:
            for namespace in self._namespaces:
                group.create_task(self._serve(namespace))

    async def _serve(self, namespace: str | None) -> None:
        failures = 0
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list(namespace)
                    failures = 0
                opened = asyncio.get_running_loop().time()
                version = await self._watch(namespace, version)
                if asyncio.get_running_loop().time() - opened < 1.0:  # ended at once: never a busy loop
                    failures += 1
                    await self._sleep(BACKOFF[min(failures - 1, len(BACKOFF) - 1)])
                else:
                    failures = 0
            except Expired:
                logger.info("the AgentRun watch%s expired; listing again", _where(namespace))
                version = None
            except APIGoneError:
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # anything else: said, paused, and the watch goes on
                pause = BACKOFF[min(failures, len(BACKOFF) - 1)]
                failures += 1
                logger.warning(
                    "the AgentRun watch%s failed (retried in %g s): %s",
                    _where(namespace),
                    pause,
                    str(exc) or type(exc).__name__,
                )
                await self._sleep(pause)

    async def _list(self, namespace: str | None) -> str:
        """Every run, page by page, delivered as type None; the listing's resourceVersion."""
        token: str | None = None
        while True:
            query: dict[str, Any] = {"limit": PAGE}
            if token:
                query["continue"] = token
            page = json.loads(await self._get(namespace, query))
            for item in page.get("items") or ():
                await self._event(None, item)
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self._first_listed.add(namespace)
                if len(self._first_listed) == len(self._namespaces):
                    self.listed.set()
                return str(meta.get("resourceVersion") or "")

    async def _watch(self, namespace: str | None, version: str) -> str:
        """Events from ``version`` until the API server ends the stream; the last version seen."""
        query: dict[str, Any] = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": WATCH_SECONDS,
            "resourceVersion": version,
        }
        response = await self._open(namespace, query)
        try:
            with typed_errors():
                async for line in response.content:  # one JSON event per line, however long
                    if not line.strip():
                        continue
                    event = json_text.decode(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Expired()
                        raise refused(int(obj.get("code") or 500), obj.get("reason"), json.dumps(obj), {})
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind != "BOOKMARK":
                        await self._event(kind, obj)
        finally:
            response.release()
        return version

    async def _event(self, kind: str | None, body: Mapping[str, Any]) -> None:
        """One event to ``deliver``; a failure there is logged, never the end of the watch."""
        meta = body.get("metadata") or {}
        if LEGACY_FINALIZER in (meta.get("finalizers") or ()):
            await self._drop_finalizer(meta)
        try:
            await self._deliver(kind, body)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception(
                "handling a watch event of AgentRun %s/%s failed", meta.get("namespace"), meta.get("name")
            )

    async def _drop_finalizer(self, meta: Mapping[str, Any]) -> None:
        finalizers = list(meta.get("finalizers") or ())
        index = finalizers.index(LEGACY_FINALIZER)
        patch = [
            {"op": "test", "path": f"/metadata/finalizers/{index}", "value": LEGACY_FINALIZER},
            {"op": "remove", "path": f"/metadata/finalizers/{index}"},
        ]
        try:
            await self._kube.patch_run(meta["namespace"], meta["name"], patch, content_type=JSON_PATCH)
        except APIError as exc:  # the next event of the run tries again
            logger.debug("could not take the earlier build's finalizer off %s: %s", meta.get("name"), exc)

    def _path(self, namespace: str | None) -> str:
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"/apis/{GROUP}/{VERSION}{where}/{PLURAL}"

    async def _get(self, namespace: str | None, query: dict[str, Any]) -> bytes:
        return await call(self._kube.request("GET", self._path(namespace), query=query))

    async def _open(self, namespace: str | None, query: dict[str, Any]) -> Any:
        """The watch response, its status checked; the caller reads and releases it."""
        request = self._kube.request("GET", self._path(namespace), query=query, timeout=WATCH_SECONDS + 30)
        return await opened(request)


def _where(namespace: str | None) -> str:
    return f" in {namespace}" if namespace else ""
