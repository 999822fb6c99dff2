"""Watches: what a new watch gets first (a list, or history since a ``resourceVersion``), then the stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock

from agentrun_sandbox.kube import tables
from agentrun_sandbox.kube.basics import sort_key
from agentrun_sandbox.kube.faults import Faults
from agentrun_sandbox.kube.http import ApiError, RequestRecord, status_body, truthy
from agentrun_sandbox.kube.registry import ResourceType
from agentrun_sandbox.kube.selectors import LabelSelector
from agentrun_sandbox.kube.verbs import EmulatorVerbs
from agentrun_sandbox.kube.watch_events import Watcher

_INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass
class WatchPlan:
    rtype: ResourceType
    watcher: Watcher | None
    initial: list[tuple[str, Mapping[str, Any]]]
    timeout: float | None
    table: bool
    expired: dict[str, Any] | None = None


MAX_REQUEST_BYTES = 3 * 1024 * 1024


@attrs.define(kw_only=True)
class EmulatorWatch(EmulatorVerbs):
    """Watch streams with resumption, initial events, timeouts and injected drops."""

    faults: Faults = attrs.field(factory=Faults)

    # Watches

    def _plan_watch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str | None,
        query: Mapping[str, str],
        *,
        table: bool,
    ) -> WatchPlan:
        labels = LabelSelector.parse(query.get("labelSelector"))
        fields = self._field_selector(rtype, query.get("fieldSelector"))
        watcher = Watcher(rtype, namespace=namespace, name=name, labels=labels, fields=fields)
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        since = query.get("resourceVersion") or ""
        initial: list[tuple[str, Mapping[str, Any]]] = []
        if truthy(query.get("sendInitialEvents")) or since in ("", "0"):
            initial = [
                ("ADDED", obj)
                for _, obj in sorted(self._live[rtype.key].items(), key=sort_key)
                if watcher.matches(obj)
            ]
            if truthy(query.get("sendInitialEvents")):
                bookmark = {
                    "kind": rtype.kind,
                    "apiVersion": rtype.api_version,
                    "metadata": {
                        "resourceVersion": str(self._rv),
                        "annotations": {_INITIAL_EVENTS_END: "true"},
                    },
                }
                initial.append(("BOOKMARK", bookmark))
        else:
            try:
                since_rv = int(since)
            except ValueError:
                raise ApiError.bad_request(f"invalid resource version: {since}") from None
            compacted = self._compacted.get(rtype.key, 0)
            if since_rv < compacted:
                message = f"too old resource version: {since_rv} ({compacted})"
                return WatchPlan(
                    rtype, None, [], timeout, table, expired=status_body(410, "Expired", message)
                )
            for event in self._history[rtype.key]:
                if event.rv > since_rv and (translated := watcher.translate(event)) is not None:
                    initial.append(translated)
        self._watchers.setdefault(rtype.key, set()).add(watcher)
        return WatchPlan(rtype, watcher, initial, timeout, table)

    async def _stream(
        self, request: kmock.Request, record: RequestRecord, plan: WatchPlan
    ) -> aiohttp.web.StreamResponse:
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "application/json"
        record.status = 200
        drop = self.faults.take_watch_drop(record)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + plan.timeout if plan.timeout is not None else None
        drop_at = (
            loop.time() + drop.after_seconds if drop is not None and drop.after_seconds is not None else None
        )
        sent = 0
        dropped = False

        async def emit(kind: str, obj: Mapping[str, Any]) -> None:
            if plan.table and kind != "ERROR" and kind != "BOOKMARK":
                payload: Mapping[str, Any] = tables.as_table(
                    plan.rtype, [self._present(plan.rtype, obj)], str(self._rv)
                )
            else:
                payload = self._present(plan.rtype, obj) if kind != "ERROR" else obj
            await response.write(
                json.dumps({"type": kind, "object": payload}, separators=(",", ":")).encode() + b"\n"
            )

        try:
            await response.prepare(request._raw_request)
            if plan.expired is not None:
                await emit("ERROR", plan.expired)
                return response
            pending: deque[tuple[str, Mapping[str, Any]] | None] = deque(plan.initial)
            while True:
                if drop is not None and drop.after_events is not None and sent >= drop.after_events:
                    dropped = True
                    break
                if pending:
                    item = pending.popleft()
                else:
                    now = loop.time()
                    ends = [t for t in (deadline, drop_at) if t is not None]
                    wait = min(ends) - now if ends else None
                    if wait is not None and wait <= 0:
                        dropped = drop_at is not None and now >= drop_at
                        break
                    assert plan.watcher is not None
                    try:
                        item = await asyncio.wait_for(plan.watcher.queue.get(), wait)
                    except TimeoutError:
                        continue
                if item is None:
                    break
                await emit(*item)
                sent += 1
            if dropped and drop is not None and drop.expire:
                await emit(
                    "ERROR", status_body(410, "Expired", f"too old resource version: {self._rv} ({self._rv})")
                )
        except ConnectionError:
            pass
        finally:
            if plan.watcher is not None:
                self._watchers.get(plan.rtype.key, set()).discard(plan.watcher)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await response.write_eof()
        return response
