"""Sub-agents: an agent tool call runs a child AgentRun from an Agent; the real operator on both backends.

The fake Messages API answers the parent and every child from their own scripts (a child's task
carries its script's tag) and bills each request under the run uid the operator sends, so the
parent's status.usage is checked against the API's own bill rather than against the operator.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentrun.api import LABEL_AGENT, LABEL_DEPTH, LABEL_PARENT, LABEL_PARENT_UID, LABEL_TOOL_USE
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    HttpError,
    Reply,
    Script,
    ScriptUsage,
    SlowResponse,
    text_block,
    tool_use_block,
)
from tests.support.builders import agentrun
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.kube_requests import cancel_run, request, until, wait_finished
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-children-test-0123456789"
WAIT = 90.0
PARENT_USAGE = [ScriptUsage(1000, 100), ScriptUsage(2000, 50)]
CHILD_USAGE = {"a": ScriptUsage(300, 30), "b": ScriptUsage(400, 40), "c": ScriptUsage(500, 50)}
PARENT_LIMITS = {"tokenBudget": 30_000, "costBudgetUSD": 0.9, "timeoutSeconds": 600}


def fan_out_script(tag: str, children: str, *, slow: float = 0.0) -> list[Script]:
    """The parent calls the research tool once per child in one turn, then answers; each child
    answers its task in one reply (after `slow` seconds)."""
    calls = [
        tool_use_block("research", {"task": f"[{tag}:child-{c}] find {c}"}, id=f"toolu_{c}") for c in children
    ]
    faults = (SlowResponse(seconds=slow),) if slow else ()
    return [
        Script(
            f"[{tag}:parent]",
            [
                Reply(calls, usage=PARENT_USAGE[0]),
                Reply([text_block("summary of the children")], usage=PARENT_USAGE[1]),
            ],
        ),
        *(
            Script(
                f"[{tag}:child-{c}]",
                [Reply([text_block(f"result {c}")], usage=CHILD_USAGE[c], faults=faults)],
            )
            for c in children
        ),
    ]


SCRIPTS = [
    *fan_out_script("fan", "abc"),
    *fan_out_script("kill", "abc", slow=4.0),
    *fan_out_script("cancel", "a", slow=300.0),
    *fan_out_script("depth", "a"),
    *fan_out_script("delete", "ab"),
    Script(
        "[failing:parent]",
        [
            Reply([tool_use_block("research", {"task": "[failing:child] go"}, id="toolu_f")]),
            Reply([text_block("the child failed")]),
        ],
    ),
    Script("[failing:child]", [HttpError(status=400, error_type="invalid_request_error")]),
    fan_out_script("approval", "a")[0],
    Script(
        "[approval:child-a]",
        [Reply([tool_use_block("current_time", {}, id="toolu_clock")]), Reply([text_block("it is late")])],
    ),
]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY)
    async with api.running() as server:
        yield server


def operator_env(model: FakeMessagesAPI, **extra: str) -> dict[str, str]:
    return {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_STATUS_INTERVAL_SECONDS": "0.5",
        "AGENTRUN_CHILD_POLL_SECONDS": "5",
        **extra,
    }


async def create_agent(cluster: TestCluster, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {"systemPrompt": "You research one thing.", "model": {"name": "claude-haiku-4-5"}, **spec},
    }
    await request(cluster, "POST", cluster.path("agents", api=RUNS_API), json=body)


async def start_parent(cluster: TestCluster, name: str, tag: str, **limits: Any) -> dict[str, Any]:
    """A parent with one agent tool, `research`, running the Agent `researcher`."""
    manifest = agentrun(
        name,
        f"[{tag}:parent] research everything",
        namespace=cluster.namespace,
        model={"name": "claude-sonnet-4-6"},
        tools=[
            {
                "agent": {
                    "name": "research",
                    "agentRef": {"name": "researcher"},
                    "description": "Researches one question and answers with a summary.",
                }
            }
        ],
        limits={**PARENT_LIMITS, **limits},
    )
    created: dict[str, Any] = await request(cluster, "POST", cluster.runs_path, json=manifest)
    return created


async def children_of(cluster: TestCluster, uid: str) -> list[dict[str, Any]]:
    listed = await request(
        cluster, "GET", cluster.runs_path, params={"labelSelector": f"{LABEL_PARENT_UID}={uid}"}
    )
    return sorted(listed["items"], key=lambda c: c["metadata"]["labels"][LABEL_TOOL_USE])


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples by (name, sorted labels)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def billed(model: FakeMessagesAPI, uids: set[str]) -> dict[str, int]:
    """What the fake API billed the runs with these uids, summed."""
    total = {"input_tokens": 0, "output_tokens": 0}
    for bill in model.bills:
        if bill.user_id in uids:
            for key in total:
                total[key] += int(bill.usage.get(key) or 0)
    return total


def tool_results(model: FakeMessagesAPI, match: str) -> dict[str, dict[str, Any]]:
    """The tool_result blocks of the parent's last request, by tool_use id."""
    last = model.requests_for(match)[-1]
    return {
        b["tool_use_id"]: b for b in last.body["messages"][-1]["content"] if b.get("type") == "tool_result"
    }


async def test_a_parent_fans_out_to_three_children_and_sums_their_usage_with_its_own(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await create_agent(cluster, "researcher", limits={"tokenBudget": 8000, "timeoutSeconds": 900})
    async with cluster.operator(tmp_path / "operator.log", operator_env(model)) as operator:
        parent = await start_parent(cluster, "fan", "fan")
        uid = parent["metadata"]["uid"]
        done = await wait_finished(cluster, "fan", timeout=WAIT)
        metrics = parse_metrics(await operator.scrape())
    ns = cluster.namespace
    assert metrics[("agentrun_child_runs_created_total", (("agent", "researcher"), ("namespace", ns)))] == 3
    assert metrics[("agentrun_runs_started_by_depth_total", (("depth", "0"), ("namespace", ns)))] == 1
    assert metrics[("agentrun_runs_started_by_depth_total", (("depth", "1"), ("namespace", ns)))] == 3
    assert metrics[("agentrun_child_runs_active", (("namespace", ns),))] == 0
    status = done["status"]
    assert (status["phase"], status["result"]) == ("Succeeded", "summary of the children")
    children = await children_of(cluster, uid)
    assert [c["metadata"]["labels"][LABEL_TOOL_USE] for c in children] == ["toolu_a", "toolu_b", "toolu_c"]
    for child in children:
        metadata, spec = child["metadata"], child["spec"]
        assert metadata["labels"][LABEL_PARENT] == "fan"
        assert (metadata["labels"][LABEL_DEPTH], metadata["labels"][LABEL_AGENT]) == ("1", "researcher")
        owner = metadata["ownerReferences"][0]
        assert (owner["uid"], owner["controller"], owner["blockOwnerDeletion"]) == (uid, True, True)
        assert spec["agentRef"] == {"name": "researcher"}
        # Carved: the Agent allows 8000, a third of what the parent had left is less.
        assert spec["limits"]["tokenBudget"] == min(8000, (30_000 - 1100) // 3)
        assert 0.29 < spec["limits"]["costBudgetUSD"] <= 0.3
        assert 100 <= spec["limits"]["timeoutSeconds"] <= 200
        assert child["status"]["phase"] == "Succeeded"
    results = tool_results(model, "[fan:parent]")
    assert {k: v["content"] for k, v in results.items()} == {
        "toolu_a": "result a",
        "toolu_b": "result b",
        "toolu_c": "result c",
    }
    # The parent's usage is its own bill plus its children's, as the API billed them.
    bill = billed(model, {uid, *(c["metadata"]["uid"] for c in children)})
    assert (status["usage"]["inputTokens"], status["usage"]["outputTokens"]) == (
        bill["input_tokens"],
        bill["output_tokens"],
    )
    assert bill["input_tokens"] == 1000 + 2000 + 300 + 400 + 500
    summary = status["children"]
    assert (summary["total"], summary["active"], summary["succeeded"], summary["failed"]) == (3, 0, 3, 0)
    assert summary["tokens"] == 330 + 440 + 550
    assert summary["awaitingApproval"] == []


async def test_an_operator_killed_while_children_run_resumes_waiting_without_a_second_child(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await create_agent(cluster, "researcher")
    first = cluster.operator_process(tmp_path / "operator-1.log", operator_env(model))
    await first.start()
    try:
        parent = await start_parent(cluster, "kill", "kill")
        uid = parent["metadata"]["uid"]

        async def all_children_asked() -> bool:
            asked = {r.first_user_text for r in model.requests_for("[kill:child-")}
            return len(asked) == 3 and len(await children_of(cluster, uid)) == 3

        await until(all_children_asked, "three children waiting for their model", timeout=WAIT)
    finally:
        await first.stop(kill=True)
    second: OperatorProcess = cluster.operator_process(tmp_path / "operator-2.log", operator_env(model))
    await second.start()
    try:
        done = await wait_finished(cluster, "kill", timeout=WAIT)
    finally:
        await second.stop()
    children = await children_of(cluster, uid)
    assert len(children) == 3  # the restarted parent found its children by name
    assert all(c["status"]["phase"] == "Succeeded" for c in children)
    status = done["status"]
    assert status["phase"] == "Succeeded"
    # Requests the kill cut off were billed but never answered: the children's own usage counts.
    own = billed(model, {uid})
    from_children = sum(c["status"]["usage"]["inputTokens"] for c in children)
    assert from_children == 300 + 400 + 500
    assert status["usage"]["inputTokens"] == own["input_tokens"] + from_children == 1000 + 2000 + 1200
    # Against the API's own log: every child answer counted is billed, and what is billed beyond that
    # is at most one cut-off request per child (the one in flight at the kill, asked again after it).
    children_billed = billed(model, {c["metadata"]["uid"] for c in children})["input_tokens"]
    assert from_children <= children_billed <= 2 * from_children
    assert status["children"]["total"] == 3 and status["children"]["succeeded"] == 3


async def test_cancelling_the_parent_cancels_its_children(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await create_agent(cluster, "researcher")
    async with cluster.operator(tmp_path / "operator.log", operator_env(model)):
        parent = await start_parent(cluster, "cancel", "cancel")
        uid = parent["metadata"]["uid"]
        await until(
            lambda: bool(model.requests_for("[cancel:child-a]")), "the child's model request", timeout=WAIT
        )
        await cancel_run(cluster, "cancel")
        done = await wait_finished(cluster, "cancel", timeout=WAIT)
        assert done["status"]["phase"] == "Cancelled"
        [child] = await children_of(cluster, uid)
        assert child["spec"].get("cancel") is True
        child_done = await wait_finished(cluster, child["metadata"]["name"], timeout=WAIT)
        assert child_done["status"]["phase"] == "Cancelled"


async def test_a_failing_child_gives_the_parent_a_structured_error_naming_its_stop_reason(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await create_agent(cluster, "researcher")
    async with cluster.operator(tmp_path / "operator.log", operator_env(model)):
        await start_parent(cluster, "failing", "failing")
        done = await wait_finished(cluster, "failing", timeout=WAIT)
    assert done["status"]["phase"] == "Succeeded"
    result = tool_results(model, "[failing:parent]")["toolu_f"]
    assert result["is_error"] is True
    error = json.loads(result["content"])
    assert error["code"] == "child_failed" and error["child"].startswith("failing-")
    assert error["stopReason"] == "ModelError", error
    assert done["status"]["children"]["failed"] == 1


async def test_a_call_past_the_depth_limit_starts_no_child(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await create_agent(cluster, "researcher")
    env = operator_env(model, AGENTRUN_MAX_AGENT_DEPTH="0")
    async with cluster.operator(tmp_path / "operator.log", env):
        parent = await start_parent(cluster, "depth", "depth")
        done = await wait_finished(cluster, "depth", timeout=WAIT)
    assert done["status"]["phase"] == "Succeeded"
    result = tool_results(model, "[depth:parent]")["toolu_a"]
    assert result["is_error"] is True and '"code": "depth_limit"' in result["content"]
    assert await children_of(cluster, parent["metadata"]["uid"]) == []


async def test_deleting_the_parent_deletes_its_children(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await create_agent(cluster, "researcher")
    async with cluster.operator(tmp_path / "operator.log", operator_env(model)):
        parent = await start_parent(cluster, "delete", "delete")
        uid = parent["metadata"]["uid"]
        await wait_finished(cluster, "delete", timeout=WAIT)
        assert len(await children_of(cluster, uid)) == 2
        await request(cluster, "DELETE", f"{cluster.runs_path}/delete")

        async def children_gone() -> bool:
            return await children_of(cluster, uid) == []

        await until(children_gone, "the children deleted with their parent", timeout=WAIT)


async def test_a_child_awaiting_approval_shows_in_the_parents_status(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await create_agent(
        cluster, "researcher", tools=[{"builtin": {"name": "current_time"}, "requiresApproval": True}]
    )
    async with cluster.operator(tmp_path / "operator.log", operator_env(model)):
        parent = await start_parent(cluster, "approval", "approval")
        uid = parent["metadata"]["uid"]
        seen: list[dict[str, Any]] = []

        async def parent_shows_it() -> bool:
            body = await request(cluster, "GET", f"{cluster.runs_path}/approval")
            waiting = ((body.get("status") or {}).get("children") or {}).get("awaitingApproval") or []
            seen[:] = waiting
            return bool(waiting)

        await until(parent_shows_it, "the child's approval in the parent's status", timeout=WAIT)
        [child] = await children_of(cluster, uid)
        assert seen == [
            {"run": child["metadata"]["name"], "toolUseId": "toolu_clock", "tool": "current_time"}
        ]
