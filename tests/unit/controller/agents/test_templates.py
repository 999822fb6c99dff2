"""SandboxTemplates as the watch shows them: an Agent's warm pool is made of the sandbox its runs
resolve (the same pool key), waits for a template not seen yet, and follows the template's events."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrun.agents import resolve
from agentrun.api.agent import AgentSpec
from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus
from agentrun.controller.agentruns.template_resolving import TemplateWaiters, resolve_template
from agentrun.controller.agents.pools import WarmPools
from agentrun.controller.agents.templates import SandboxTemplates, TemplateEvents
from agentrun.tools.environment import KubeConnection
from agentrun.tools.sandbox.manifests import pool_key

RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
TEMPLATE: dict[str, Any] = {
    "metadata": {"name": "python", "namespace": "team-a", "uid": "t-1", "generation": 1},
    "spec": {"image": "python:3.12", "resources": RESOURCES, "workingDir": "/src"},
}
AGENT: dict[str, Any] = {
    "metadata": {"name": "fixer", "namespace": "team-a", "uid": "a-1", "generation": 1},
    "spec": {
        "serviceAccountName": "fixer",
        "sandbox": {"templateRef": {"name": "python"}, "commandTimeoutSeconds": 30, "warmPool": 2},
    },
}


async def _no_token() -> str | None:
    return None


def _pools(templates: SandboxTemplates) -> WarmPools:
    return WarmPools(KubeConnection("http://127.0.0.1:9", None, _no_token), templates=templates)


class Agents:
    """The Agent controller as TemplateEvents sees it: the bodies seen, each fed to the pools again."""

    def __init__(self, pools: WarmPools, *bodies: Mapping[str, Any]) -> None:
        self.pools = pools
        self.agents: dict[str, Mapping[str, Any]] = {b["metadata"]["uid"]: b for b in bodies}
        self.seen: list[str] = []

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        self.seen.append(body["metadata"]["name"])
        self.pools.observe(event_type, body)


def test_a_sandbox_naming_a_template_resolves_only_once_the_template_of_its_namespace_is_seen() -> None:
    templates = SandboxTemplates()
    declared = AGENT["spec"]["sandbox"]
    assert templates.resolved("team-a", declared) is None and templates.resolved("team-a", None) is None
    templates.observe(None, {**TEMPLATE, "metadata": {**TEMPLATE["metadata"], "namespace": "team-b"}})
    assert templates.resolved("team-a", declared) is None  # another namespace's template of that name
    templates.observe("ADDED", TEMPLATE)
    sandbox = templates.resolved("team-a", declared)
    assert sandbox is not None and (sandbox.image, sandbox.working_dir, sandbox.command_timeout_seconds) == (
        "python:3.12",
        "/src",
        30,
    )
    templates.observe("DELETED", TEMPLATE)
    assert templates.resolved("team-a", declared) is None


def test_an_invalid_sandbox_or_template_resolves_to_nothing() -> None:
    templates = SandboxTemplates()
    assert templates.resolved("team-a", {"resources": RESOURCES}) is None  # no image, no template
    templates.observe(None, {**TEMPLATE, "spec": {"resources": RESOURCES}})  # past a stand-in server
    assert templates.resolved("team-a", AGENT["spec"]["sandbox"]) is None


async def test_the_pool_waits_for_its_template_then_has_the_sandbox_a_run_of_the_agent_resolves() -> None:
    templates = SandboxTemplates()
    pools = _pools(templates)
    other = {
        "metadata": {"name": "plain", "namespace": "team-a", "uid": "a-2"},
        "spec": {"sandbox": {"image": "busybox", "resources": RESOURCES, "warmPool": 1}},
    }
    agents, waiters = Agents(pools, AGENT, other), TemplateWaiters()
    pools.observe(None, AGENT)
    assert "a-1" not in pools.agents  # nothing to fill before the template is seen
    with waiters.waiting("team-a", "python") as woken:
        await TemplateEvents(templates, waiters, agents).observe("ADDED", TEMPLATE)
        assert woken.is_set()
    assert agents.seen == ["fixer"]  # only the Agents that name it are seen anew
    owner, pooled = pools.agents["a-1"]
    assert owner.service_account == "fixer" and pooled.image == "python:3.12"

    # A run of the Agent resolves the same sandbox from the same template: it claims the pool's pods.
    run = resolve(
        AgentSpec.model_validate(AGENT["spec"]), AgentRunSpec.model_validate({"task": "t"}), "fixer"
    )

    async def record(*_: Any) -> None:
        return None

    async def announce(*_: str) -> None:
        raise AssertionError("the template exists")

    class Source:
        async def get_sandbox_template(self, namespace: str, name: str) -> Mapping[str, Any]:
            return TEMPLATE

    resolved = await resolve_template(
        run,
        AgentRunStatus(),
        namespace="team-a",
        source=Source(),
        cancel=asyncio.Event(),
        announce=announce,
        record=record,
    )
    assert isinstance(resolved, ResolvedRunSpec) and resolved.sandbox is not None
    assert pool_key("team-a", "fixer", resolved.sandbox) == pool_key("team-a", "fixer", pooled)

    # The template changes: the pool follows it (a new key: its old pods are replaced at the next fill).
    edited = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "image": "python:3.13"}}
    await TemplateEvents(templates, waiters, agents).observe("MODIFIED", edited)
    assert pools.agents["a-1"][1].image == "python:3.13"
    assert pool_key("team-a", "fixer", pools.agents["a-1"][1]) != pool_key("team-a", "fixer", pooled)
    await pools.close()
