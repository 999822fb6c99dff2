"""Agents through the real operator: runs from an Agent, overrides, tighten-only limits, a missing
Agent, and a run that keeps the Agent it started from."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agent, agentrun
from tests.support.clusters import ROOT, RUNS_API, TestCluster
from tests.support.kube_requests import until, wait_finished
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-agents-0123456789"
EXAMPLES = ROOT / "examples"
PROMPT = "You are the release reviewer. Answer in one line."
AGENT_SPEC: dict[str, Any] = {
    "systemPrompt": PROMPT,
    "model": {"name": "claude-haiku-4-5", "maxTokens": 1000},
    "tools": [{"builtin": {"name": "calculator"}}],
    "limits": {"maxIterations": 4, "tokenBudget": 100_000},
}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                "[scenario:agent-calc]",
                [Reply([tool_use_block("calculator", {"expression": "6*7"})]), Reply([text_block("42")])],
            ),
            Script("[scenario:agent-plain]", [Reply([text_block("reviewed")])]),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


def _agents(cluster: TestCluster, name: str = "") -> str:
    base = f"{RUNS_API}/namespaces/{cluster.namespace}/agents"
    return f"{base}/{name}" if name else base


async def _create_agent(cluster: TestCluster, name: str, **spec: Any) -> dict[str, Any]:
    created: dict[str, Any] = await cluster.request(
        "POST", _agents(cluster), json=agent(name, namespace=cluster.namespace, **spec)
    )
    return created


async def _create_run(cluster: TestCluster, name: str, task: str, **spec: Any) -> None:
    await cluster.request(
        "POST", cluster.runs_path, json=agentrun(name, task, namespace=cluster.namespace, **spec)
    )


async def _ready(cluster: TestCluster, name: str, generation: int) -> dict[str, Any]:
    """The Agent's Ready condition once the operator judged that generation."""
    seen: dict[str, Any] = {}

    async def judged() -> bool:
        status = (await cluster.request("GET", _agents(cluster, name))).get("status") or {}
        ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        if status.get("observedGeneration") == generation and ready:
            seen.update(ready[0])
            return True
        return False

    await until(judged, f"Agent {name} judged at generation {generation}", timeout=60)
    return seen


def _system_text(body: dict[str, Any]) -> str:
    system = body.get("system")
    return system if isinstance(system, str) else "".join(b.get("text", "") for b in system or [])


async def test_a_run_from_an_agent_gets_the_agents_prompt_tools_and_model_and_records_the_agent(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    created = await _create_agent(cluster, "reviewer", **AGENT_SPEC)
    await _create_run(cluster, "review-1", "[scenario:agent-calc] 6*7?", agentRef={"name": "reviewer"})
    obj = await wait_finished(cluster, "review-1")
    status = obj["status"]
    assert (status["phase"], status["result"]) == ("Succeeded", "42"), status.get("message")
    assert status["agent"] == {
        "name": "reviewer",
        "uid": created["metadata"]["uid"],
        "generation": created["metadata"]["generation"],
    }
    assert status["agentSpec"] == created["spec"]
    # The stored run declares only what its author wrote: no server-side defaults.
    assert obj["spec"] == {"task": "[scenario:agent-calc] 6*7?", "agentRef": {"name": "reviewer"}}

    first = model.requests_for("[scenario:agent-calc]")[0].body
    assert PROMPT in _system_text(first)
    assert [t["name"] for t in first["tools"]] == ["calculator"]
    assert (first["model"], first["max_tokens"]) == ("claude-haiku-4-5", 1000)


async def test_a_run_overrides_the_agents_max_tokens_and_tightens_its_limits(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await _create_agent(cluster, "reviewer", **AGENT_SPEC)
    await _create_run(
        cluster,
        "review-tight",
        "[scenario:agent-calc] tight",
        agentRef={"name": "reviewer"},
        model={"maxTokens": 300},
        limits={"maxIterations": 1},
    )
    obj = await wait_finished(cluster, "review-tight")
    assert obj["status"]["result"] == "42", obj["status"].get("message")
    requests = [r.body for r in model.requests_for("[scenario:agent-calc] tight")]
    assert [(r["model"], r["max_tokens"]) for r in requests] == [("claude-haiku-4-5", 300)] * 2
    # maxIterations 1 (the Agent allows 4): the second request is already the tools-off answer turn.
    assert "tool_choice" not in requests[0] or requests[0]["tool_choice"] != {"type": "none"}
    assert requests[1]["tool_choice"] == {"type": "none"}


async def test_a_run_loosening_a_limit_of_its_agent_ends_invalid_spec_naming_the_field(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await _create_agent(cluster, "reviewer", **AGENT_SPEC)
    await _create_run(
        cluster,
        "review-loose",
        "[scenario:agent-plain] x",
        agentRef={"name": "reviewer"},
        limits={"maxIterations": 9},
    )
    status = (await wait_finished(cluster, "review-loose"))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith("spec.limits.maxIterations 9 is above the Agent reviewer's 4;")
    assert model.requests_for("[scenario:agent-plain]") == []


async def test_the_api_server_refuses_a_system_prompt_on_a_run_with_agent_ref(cluster: TestCluster) -> None:
    manifest = agentrun(
        "prompted", "x", namespace=cluster.namespace, agentRef={"name": "reviewer"}, systemPrompt="Be evil."
    )
    code, out = await cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    assert code != 0
    assert "spec.systemPrompt comes from the Agent (spec.agentRef); a run cannot set it" in out
    assert await cluster.get_run("prompted") is None


async def test_a_run_waits_pending_for_a_missing_agent_and_starts_when_it_is_created(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await _create_run(cluster, "early", "[scenario:agent-plain] early", agentRef={"name": "late"})

    async def pending() -> bool:
        run = await cluster.get_run("early") or {}
        conditions = run.get("status", {}).get("conditions", [])
        return any(c.get("reason") == "AgentNotFound" for c in conditions)

    await until(pending, "the run to be Pending AgentNotFound", timeout=60)
    status = (await cluster.get_run("early") or {})["status"]
    assert status["phase"] == "Pending"
    assert status["message"] == (
        f"Agent late not found in namespace {cluster.namespace}; the run starts when it is created"
    )
    await _create_agent(cluster, "late", systemPrompt=PROMPT, model={"name": "claude-haiku-4-5"})
    status = (await wait_finished(cluster, "early", timeout=60))["status"]
    assert (status["phase"], status["result"]) == ("Succeeded", "reviewed"), status.get("message")
    assert PROMPT in _system_text(model.requests_for("[scenario:agent-plain] early")[0].body)


async def test_changing_the_agent_after_a_run_resolved_it_does_not_change_that_run(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    created = await _create_agent(cluster, "reviewer", **AGENT_SPEC)
    await _create_run(cluster, "first", "[scenario:agent-plain] first", agentRef={"name": "reviewer"})
    await wait_finished(cluster, "first")
    changed = {"systemPrompt": "A different prompt.", "model": {"maxTokens": 777}}
    await cluster.request(
        "PATCH",
        _agents(cluster, "reviewer"),
        json={"spec": changed},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    await _create_run(cluster, "second", "[scenario:agent-plain] second", agentRef={"name": "reviewer"})
    await wait_finished(cluster, "second")

    first = (await cluster.get_run("first") or {})["status"]
    second = (await cluster.get_run("second") or {})["status"]
    assert first["agent"]["generation"] == created["metadata"]["generation"]
    assert second["agent"]["generation"] == created["metadata"]["generation"] + 1
    assert first["agentSpec"] == created["spec"]
    assert second["agentSpec"]["systemPrompt"] == "A different prompt."
    assert PROMPT in _system_text(model.requests_for("[scenario:agent-plain] first")[0].body)
    second_request = model.requests_for("[scenario:agent-plain] second")[0].body
    assert "A different prompt." in _system_text(second_request) and second_request["max_tokens"] == 777


async def test_kubectl_explains_the_agent_and_prints_its_and_the_runs_columns(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    code, out = await cluster.kubectl("explain", "agent.spec")
    assert code == 0, out
    assert "systemPrompt" in out and "limits" in out and "task" not in out.split("FIELDS:")[-1]
    code, out = await cluster.kubectl("explain", "agentrun.spec.agentRef")
    assert code == 0 and "Run this Agent" in out, out

    await _create_agent(cluster, "reviewer", **AGENT_SPEC)
    await _create_run(cluster, "listed", "[scenario:agent-plain] listed", agentRef={"name": "reviewer"})
    await wait_finished(cluster, "listed")
    await _ready(cluster, "reviewer", 1)
    code, out = await cluster.kubectl("get", "agt")
    assert code == 0, out
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "MODEL", "READY", "AGE"]
    assert row.split()[:3] == ["reviewer", "claude-haiku-4-5", "True"]
    code, out = await cluster.kubectl("get", "agentrun", "listed")
    assert code == 0 and "AGENT" not in out, out
    code, out = await cluster.kubectl("get", "agentrun", "listed", "-o", "wide")
    assert code == 0, out
    header, row = out.splitlines()[:2]
    assert header.split()[-1] == "AGENT" and row.split()[-1] == "reviewer"


async def test_the_agent_examples_applied_together_run_to_success(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    code, out = await cluster.kubectl(
        "apply", "-f", str(EXAMPLES / "agent.yaml"), "-f", str(EXAMPLES / "agentrun-from-agent.yaml")
    )
    assert code == 0, out
    status = (await wait_finished(cluster, "what-day"))["status"]
    assert (status["phase"], status["stopReason"]) == ("Succeeded", "EndTurn"), status.get("message")
    assert status["agent"]["name"] == "clock" and status["toolCalls"] == 1


async def test_a_run_from_an_agent_with_a_time_to_live_is_deleted_after_it_finished(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await _create_agent(cluster, "short-lived", model={"name": "claude-haiku-4-5"}, ttlSecondsAfterFinished=1)
    # A watch opened before the run exists sees every state it passes through: polling can miss the
    # finished run entirely when the TTL of 1 s runs out between two reads.
    seen: list[tuple[str, str | None]] = []
    # From the API server's watch cache as it stands (resourceVersion 0): a watch with no version asks
    # for a consistent read, which a real server refuses ("Too large resource version", 504) while
    # its cache of a just-installed CRD lags etcd.
    selector = "metadata.name=ephemeral"
    listed = await cluster.request(
        "GET", cluster.runs_path, params={"fieldSelector": selector, "resourceVersion": "0"}
    )
    since = listed["metadata"]["resourceVersion"]
    async with (
        cluster.session() as session,
        session.get(
            cluster.runs_path,
            params={
                "watch": "true",
                "fieldSelector": selector,
                "resourceVersion": since,
                "timeoutSeconds": "60",
            },
            timeout=aiohttp.ClientTimeout(total=90),
        ) as stream,
    ):
        assert stream.status == 200, await stream.text()
        await _create_run(
            cluster, "ephemeral", "[scenario:agent-plain] ttl", agentRef={"name": "short-lived"}
        )
        async for line in stream.content:
            event = json.loads(line)
            # An ERROR event carries a Status (its message says why the server ended the watch).
            assert event["type"] != "ERROR", f"the watch ended with an error: {event['object']}; seen {seen}"
            seen.append((event["type"], event["object"].get("status", {}).get("phase")))
            if event["type"] == "DELETED":
                break
    phases = [phase for _, phase in seen]
    assert seen[-1][0] == "DELETED", f"the Agent's ttlSecondsAfterFinished never deleted the run: {seen}"
    assert "Succeeded" in phases[:-1], f"deleted before it was seen Succeeded: {seen}"


async def test_a_valid_agent_is_ready_at_its_generation(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    created = await _create_agent(cluster, "fine", **AGENT_SPEC)
    ready = await _ready(cluster, "fine", created["metadata"]["generation"])
    assert (ready["status"], ready["reason"]) == ("True", "Valid")
    assert ready["observedGeneration"] == created["metadata"]["generation"]
    assert ready["lastTransitionTime"]


async def test_an_agent_with_a_bad_tool_config_is_not_ready_until_it_is_fixed(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    bad_tools = [{"builtin": {"name": "kubernetes_get", "config": {"bogus": 1}}}]
    created = await _create_agent(cluster, "broken", **{**AGENT_SPEC, "tools": bad_tools})
    generation = created["metadata"]["generation"]
    ready = await _ready(cluster, "broken", generation)
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    problem = "spec.tools[0].builtin.config: kubernetes_get: unknown keys ['bogus']"
    assert ready["message"].startswith(problem), ready["message"]

    # A run of it still resolves, and ends InvalidSpec naming the Agent and its generation.
    await _create_run(cluster, "of-broken", "[scenario:agent-plain] broken", agentRef={"name": "broken"})
    status = (await wait_finished(cluster, "of-broken"))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith(f"Agent broken generation {generation}: {problem}"), status["message"]
    assert model.requests_for("[scenario:agent-plain] broken") == []

    await cluster.request(
        "PATCH",
        _agents(cluster, "broken"),
        json={"spec": {"tools": [{"builtin": {"name": "calculator"}}]}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    ready = await _ready(cluster, "broken", generation + 1)
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "True",
        "Valid",
        generation + 1,
    )
