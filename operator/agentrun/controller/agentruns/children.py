"""Child runs of agent tools: created from an Agent, waited for through the AgentRun watch.

Every replica sees every AgentRun event (handling.py), so the replica executing a parent hears its
children finish without a watch of its own; a slow GET poll covers a missed event. The child's
name is derived from the parent's uid and the tool_use id: a parent resumed after a crash repeats
the call, finds its child (GET, or 409 on create) and waits for it again; it never starts a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.api import (
    API_VERSION,
    KIND,
    LABEL_AGENT,
    LABEL_DEPTH,
    LABEL_PARENT,
    LABEL_PARENT_UID,
    LABEL_TOOL_USE,
    status_patches,
)
from agentrun.api.model_spec import ModelSpec
from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import Phase
from agentrun.api.status_patches import StatusPatch
from agentrun.api.usage import TokenUsage
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIAlreadyExistsError, APIError, APINotFoundError
from agentrun.loop.errors import ToolError
from agentrun.loop.events import Event, RunFinished
from agentrun.metrics.definitions import Metrics
from agentrun.tools.agent_calling import ChildRequest, ChildResult, carve, child_name, tool_use_label

logger = logging.getLogger(__name__)

Listener = Callable[[str | None, RunObject], None]


def depth_of(labels: Mapping[str, Any]) -> int:
    """A run's depth in its tree: its LABEL_DEPTH, 0 without one (or with a value that is no number)."""
    try:
        return max(int(str(labels.get(LABEL_DEPTH, "0"))), 0)
    except ValueError:
        return 0


def children_selector(parent_uid: str) -> str:
    return f"{LABEL_PARENT_UID}={parent_uid}"


class ChildWatch:
    """Routes watch events of child runs (labelled with their parent's uid) to whoever listens for
    that parent: the agent tools of a parent executing here."""

    def __init__(self) -> None:
        self._listeners: dict[str, list[Listener]] = {}

    def observe(self, event_type: str | None, run: RunObject) -> None:
        parent = run.labels.get(LABEL_PARENT_UID)
        for listener in list(self._listeners.get(parent, ())) if parent else ():
            listener(event_type, run)

    @contextlib.contextmanager
    def listening(self, parent_uid: str, listener: Listener) -> Any:
        self._listeners.setdefault(parent_uid, []).append(listener)
        try:
            yield
        finally:
            listeners = self._listeners.get(parent_uid, [])
            with contextlib.suppress(ValueError):
                listeners.remove(listener)
            if not listeners:
                self._listeners.pop(parent_uid, None)


@dataclass(frozen=True)
class Parent:
    namespace: str
    name: str
    uid: str
    depth: int


@dataclass
class RunChildren:
    """The ChildRuns of one executing parent (tools/agent_calling.py), and its status.children.

    Also an observer of the parent's loop: on RunFinished the summary is written before the
    terminal status patch, so a finished parent's status.children is final.
    """

    kube: KubeClient
    parent: Parent
    watch: ChildWatch
    metrics: Metrics
    write: Callable[[StatusPatch], Awaitable[None]]
    max_depth: int = 3
    poll_seconds: float = 30.0
    summary_interval: float = 5.0
    clock: Callable[[], float] = field(default=lambda: asyncio.get_running_loop().time())
    _bodies: dict[str, RunObject] = field(default_factory=dict)
    _changed: dict[str, asyncio.Event] = field(default_factory=dict)
    _summary: asyncio.Task[None] | None = None
    _summary_wanted: bool = False
    _last_summary: float | None = None

    async def run(self, request: ChildRequest) -> ChildResult:
        parent = self.parent
        depth = parent.depth + 1
        if depth > self.max_depth:
            raise ToolError(
                "depth_limit",
                f"a sub-agent here would be at depth {depth}, deeper than the operator allows "
                f"(AGENTRUN_MAX_AGENT_DEPTH={self.max_depth})",
                hint="do the task yourself",
            )
        name = child_name(parent.name, parent.uid, request.tool_use_id)
        changed = self._changed.setdefault(name, asyncio.Event())
        with self.watch.listening(parent.uid, self._heard):
            body = await self._find_or_create(name, request, depth)
            self._bodies[name] = body
            self._summarise()
            self.metrics.child_waiting(parent.namespace, 1)
            try:
                body = await self._wait(name, changed)
            finally:
                self.metrics.child_waiting(parent.namespace, -1)
                self._summarise()
        return result_of(name, body)

    def _heard(self, event_type: str | None, child: RunObject) -> None:
        name = child.name
        self._bodies[name] = _deleted(child) if event_type == "DELETED" else child
        event = self._changed.get(name)
        if event is not None:
            event.set()
        self._summarise()

    async def _find_or_create(self, name: str, request: ChildRequest, depth: int) -> RunObject:
        parent = self.parent
        try:
            existing = await self.kube.get_run(parent.namespace, name)
        except APINotFoundError:
            pass
        else:
            return self._ours(existing)
        agent = await self.kube.get_agent(parent.namespace, request.agent)
        if agent is None:
            raise ToolError(
                "agent_not_found",
                f"Agent {request.agent} does not exist in namespace {parent.namespace}",
                hint="tell the user the sub-agent is not installed",
            )
        limits = carve((agent.get("spec") or {}).get("limits") or {}, request.budget)
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": name,
                "namespace": parent.namespace,
                "labels": {
                    LABEL_PARENT: parent.name,
                    LABEL_PARENT_UID: parent.uid,
                    LABEL_TOOL_USE: tool_use_label(request.tool_use_id),
                    LABEL_DEPTH: str(depth),
                    LABEL_AGENT: request.agent,
                },
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": KIND,
                        "name": parent.name,
                        "uid": parent.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"agentRef": {"name": request.agent}, "task": request.task, "limits": limits},
        }
        try:
            created = await self.kube.create_run(parent.namespace, body)
        except APIAlreadyExistsError:
            # Created between the GET and now (another execution of this parent): that one is the child.
            return self._ours(await self.kube.get_run(parent.namespace, name))
        self.metrics.child_created(parent.namespace, request.agent)
        return RunObject.parse(created)

    def _ours(self, body: Mapping[str, Any]) -> RunObject:
        child = RunObject.parse(body)
        if child.labels.get(LABEL_PARENT_UID) != self.parent.uid:
            raise ToolError(
                "child_conflict",
                f"a run named {child.name} exists and is not a child of this run",
                hint="try again later",
            )
        return child

    async def _wait(self, name: str, changed: asyncio.Event) -> RunObject:
        while True:
            child = self._bodies[name]
            if child.finished:
                return child
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), timeout=self.poll_seconds)
            except TimeoutError:
                try:
                    self._bodies[name] = RunObject.parse(await self.kube.get_run(self.parent.namespace, name))
                except APINotFoundError:
                    self._bodies[name] = _deleted(self._bodies[name])
                except APIError as exc:  # the watch or the next poll tells
                    logger.warning("could not read child run %s: %s", name, exc)

    # status.children ---------------------------------------------------------------------------

    def _summarise(self) -> None:
        """A summary write soon: at most one per summary interval, the last change always written."""
        self._summary_wanted = True
        if self._summary is None or self._summary.done():
            self._summary = asyncio.get_running_loop().create_task(self._write_summaries())

    async def _write_summaries(self) -> None:
        while self._summary_wanted:
            if self._last_summary is not None:
                await asyncio.sleep(max(self._last_summary + self.summary_interval - self.clock(), 0))
            self._summary_wanted = False
            await self._write_summary()

    async def _write_summary(self) -> list[Mapping[str, Any]]:
        """The children as listed for the summary written (none when either call failed)."""
        self._last_summary = self.clock()
        try:
            listed = await self.kube.list_runs(
                self.parent.namespace, label_selector=children_selector(self.parent.uid)
            )
            children: list[Mapping[str, Any]] = list(listed.get("items") or [])
            await self.write(status_patches.children(children))
        except APIError as exc:  # the next change writes it again
            logger.warning("could not write status.children: %s", exc)
            return []
        return children

    async def notify(self, event: Event) -> None:
        if isinstance(event, RunFinished):
            await self.flush()

    async def flush(self) -> None:
        """The final summary, now (a finished parent's status.children is complete). Children still
        running belong to calls the parent gave up (its timeout or cancel): nobody will read their
        result, so they are cancelled."""
        self.stop()
        if self._summary is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._summary
        if self._bodies or self._last_summary is not None:
            self._summary_wanted = False
            children = await self._write_summary()
            if any(not RunObject.parse(c).finished for c in children):
                with contextlib.suppress(APIError):
                    await cancel_children(self.kube, self.parent.namespace, self.parent.uid)

    def stop(self) -> None:
        """No more summary writes (the run stops here: handed over, or the operator shuts down)."""
        if self._summary is not None and not self._summary.done():
            self._summary.cancel()


def _deleted(child: RunObject) -> RunObject:
    if child.finished:
        return child
    status = child.status.model_copy(
        update={"phase": Phase.FAILED, "stop_reason": "Deleted", "message": "the child run was deleted"}
    )
    return dataclasses.replace(child, status=status)


def result_of(name: str, child: RunObject) -> ChildResult:
    status, spec = child.status, child.spec
    if isinstance(spec, AgentRunSpec) and "name" in spec.model.model_fields_set:
        model = spec.model.name
    else:  # the Agent's, as the child recorded it
        model = child.agent.model.name if child.agent is not None else ModelSpec().name
    used = status.usage
    usage = TokenUsage(
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        cache_creation_input_tokens=used.cache_creation_input_tokens,
        cache_read_input_tokens=used.cache_read_input_tokens,
    )
    by_model = {model: usage} if usage.total else {}
    return ChildResult(
        name=name,
        phase=str(status.phase.value if status.phase is not None else None),
        stop_reason=status.stop_reason,
        message=status.message,
        result=status.result,
        output=status.output,
        has_output=status.output is not None,
        usage_by_model=by_model,
    )


async def cancel_children(kube: KubeClient, namespace: str, parent_uid: str) -> None:
    """spec.cancel on every unfinished child; each child's own cancel reaches its children in turn."""
    listed = await kube.list_runs(namespace, label_selector=children_selector(parent_uid))
    for item in listed.get("items") or []:
        child = RunObject.parse(item)
        if child.finished or child.spec.cancel:
            continue
        name = child.name
        try:
            await kube.patch_run(namespace, name, {"spec": {"cancel": True}})
        except APINotFoundError:
            continue


async def delete_children(kube: KubeClient, namespace: str, parent_uid: str) -> None:
    """What garbage collection does too, sooner (and where no garbage collector runs)."""
    listed = await kube.list_runs(namespace, label_selector=children_selector(parent_uid))
    for child in listed.get("items") or []:
        metadata = child["metadata"]
        try:
            await kube.delete_run(namespace, metadata["name"], metadata["uid"])
        except APINotFoundError:
            continue
        except APIError as exc:
            logger.warning("could not delete child run %s/%s: %s", namespace, metadata["name"], exc)
