"""The controller's side of agent tools: finding or creating a call's child, and hearing it finish."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from agentrun.api import LABEL_PARENT_UID
from agentrun.api.status_patches import StatusPatch
from agentrun.controller.agentruns.children import ChildWatch, Parent, RunChildren, depth_of
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIAlreadyExistsError, APINotFoundError
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import CallBudget
from agentrun.metrics.definitions import Metrics
from agentrun.tools.agent_calling import ChildRequest, child_name

PARENT = Parent("team", "boss", "uid-boss", depth=1)


def child_body(name: str, phase: str | None = None, parent_uid: str = PARENT.uid) -> dict[str, Any]:
    status = {"phase": phase, "result": f"{name} done", "usage": {"inputTokens": 7}} if phase else {}
    return {
        "metadata": {"name": name, "labels": {LABEL_PARENT_UID: parent_uid}},
        "spec": {"task": "t", "agentRef": {"name": "helper"}},
        "status": status,
    }


@dataclass
class FakeKube:
    """Answers GET with `existing` (404 until set), creates with a 409 when `race` is set."""

    existing: dict[str, Any] | None = None
    race: dict[str, Any] | None = None
    agent: dict[str, Any] | None = field(default_factory=lambda: {"spec": {"limits": {"tokenBudget": 500}}})
    created: list[dict[str, Any]] = field(default_factory=list)
    creating: asyncio.Event = field(default_factory=asyncio.Event)

    async def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        if self.existing is None:
            raise APINotFoundError("not found", status=404)
        return self.existing

    async def get_agent(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.agent

    async def create_run(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.race is not None:
            self.existing = self.race
            raise APIAlreadyExistsError("exists", status=409, reason="AlreadyExists")
        self.created.append(body)
        self.creating.set()
        return body

    async def list_runs(self, namespace: str | None, **kwargs: Any) -> dict[str, Any]:
        return {"items": []}


def children_of(kube: FakeKube, watch: ChildWatch, **kwargs: Any) -> RunChildren:
    async def write(patch: StatusPatch) -> None:
        pass

    return RunChildren(
        cast(KubeClient, kube), PARENT, watch, Metrics(CollectorRegistry()), write, poll_seconds=30, **kwargs
    )


def request(tool_use_id: str = "toolu_1") -> ChildRequest:
    return ChildRequest("research", "researcher", "find it", tool_use_id, CallBudget(tokens=900, siblings=3))


async def test_a_new_child_is_created_with_carved_limits_and_its_finish_is_heard_from_the_watch() -> None:
    kube, watch = FakeKube(), ChildWatch()
    children = children_of(kube, watch)
    call = asyncio.create_task(children.run(request()))
    await asyncio.wait_for(kube.creating.wait(), 5)
    [created] = kube.created
    name = child_name("boss", "uid-boss", "toolu_1")
    assert created["metadata"]["name"] == name
    assert created["spec"]["limits"]["tokenBudget"] == 300
    assert created["metadata"]["labels"]["agentrun.dev/depth"] == "2"
    watch.observe(
        "MODIFIED", RunObject.parse(child_body("someone-else", "Succeeded", parent_uid="uid-other"))
    )
    watch.observe("MODIFIED", RunObject.parse(child_body(name, "Running")))
    await asyncio.sleep(0)
    assert not call.done()
    watch.observe("MODIFIED", RunObject.parse(child_body(name, "Succeeded")))
    result = await asyncio.wait_for(call, 5)
    assert (result.phase, result.result) == ("Succeeded", f"{name} done")
    assert sum(u.total for u in result.usage_by_model.values()) == 7


async def test_a_call_whose_create_races_another_execution_uses_the_existing_child() -> None:
    name = child_name("boss", "uid-boss", "toolu_1")
    kube = FakeKube(race=child_body(name, "Succeeded"))
    result = await children_of(kube, ChildWatch()).run(request())
    assert kube.created == [] and result.name == name and result.succeeded


async def test_a_run_of_the_childs_name_that_is_not_a_child_is_not_waited_for() -> None:
    kube = FakeKube(existing=child_body(child_name("boss", "uid-boss", "toolu_1"), parent_uid="uid-other"))
    with pytest.raises(ToolError) as caught:
        await children_of(kube, ChildWatch()).run(request())
    assert caught.value.code == "child_conflict"


async def test_a_call_too_deep_or_for_a_missing_agent_starts_no_child() -> None:
    kube = FakeKube(agent=None)
    with pytest.raises(ToolError) as deep:
        await children_of(kube, ChildWatch(), max_depth=1).run(request())
    with pytest.raises(ToolError) as missing:
        await children_of(kube, ChildWatch()).run(request())
    assert (deep.value.code, missing.value.code) == ("depth_limit", "agent_not_found")
    assert kube.created == []


def test_a_run_without_a_depth_label_is_at_depth_zero() -> None:
    assert (depth_of({}), depth_of({"agentrun.dev/depth": "2"}), depth_of({"agentrun.dev/depth": "x"})) == (
        0,
        2,
        0,
    )
