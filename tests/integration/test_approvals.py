"""Human approval end to end: the real operator process, the scenario's API server, the fake model.

Runs against the emulator and, with `--real-cluster`, a real kube-apiserver. Decisions written by hand
carry the requester's own user name (asked from the server): a shared real server may have the approval
policy installed cluster-wide, which admits a new decision only in its recorder's name.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import until, wait_status
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-approvals-0123456789"
SCENARIO = "[scenario:approve-calc]"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                SCENARIO,
                [
                    Reply([tool_use_block("calculator", {"expression": "17*23+4"}, id="toolu_ap1")]),
                    Reply([text_block("All done.")]),
                ],
            )
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


async def _create(cluster: TestCluster, manifest: dict[str, Any]) -> None:
    await cluster.request("POST", cluster.runs_path, json=manifest)


async def _merge_patch(cluster: TestCluster, name: str, patch: dict[str, Any]) -> tuple[int, Any]:
    return await cluster.status_of(
        "PATCH", f"{cluster.runs_path}/{name}", data=json.dumps(patch), headers=MERGE_PATCH
    )


def _finished(status: dict[str, Any]) -> bool:
    return status.get("phase") in ("Succeeded", "Failed", "Cancelled")


def _awaiting(status: dict[str, Any]) -> bool:
    return status.get("phase") == "AwaitingApproval"


def _manifest(cluster: TestCluster, name: str, **limits: Any) -> dict[str, Any]:
    return agentrun(
        name,
        f"{SCENARIO} how many pods?",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}],
        limits=limits,
    )


async def test_run_waits_in_awaiting_approval_until_spec_approvals_approves_then_succeeds(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    me = await cluster.whoami()
    await _create(cluster, _manifest(cluster, "gated"))
    status = await wait_status(cluster, "gated", _awaiting)
    [pending] = status["pendingApprovals"]
    assert (pending["toolUseId"], pending["toolName"], pending["input"]) == (
        "toolu_ap1",
        "calculator",
        {"expression": "17*23+4"},
    )
    assert pending["since"].endswith("Z")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Reconciling"]["status"], conditions["Reconciling"]["reason"]) == (
        "True",
        "AwaitingApproval",
    )
    assert conditions["Stalled"]["status"] == "False"
    await asyncio.sleep(1)
    assert len(model.requests_for(SCENARIO)) == 1  # nothing moves without a decision

    code, body = await _merge_patch(
        cluster,
        "gated",
        {"spec": {"approvals": [{"toolUseId": "toolu_ap1", "decision": "approve", "by": me}]}},
    )
    assert code == 200, body
    final = await wait_status(cluster, "gated", _finished)
    assert (final["phase"], final["stopReason"], final["toolCalls"]) == ("Succeeded", "EndTurn", 1)
    assert "pendingApprovals" not in final
    result = model.requests_for(SCENARIO)[1].body["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_ap1" and '"value": 395' in result["content"]
    assert f"approved by {me}" in operator.logs()


async def test_denied_call_reaches_the_model_as_an_error_with_the_reason(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    me = await cluster.whoami()
    await _create(cluster, _manifest(cluster, "denied"))
    await wait_status(cluster, "denied", _awaiting)
    decision = {"toolUseId": "toolu_ap1", "decision": "deny", "by": me, "reason": "use your head"}
    code, body = await _merge_patch(cluster, "denied", {"spec": {"approvals": [decision]}})
    assert code == 200, body
    final = await wait_status(cluster, "denied", _finished)
    assert (final["phase"], final["toolCalls"]) == ("Succeeded", 0)
    result = model.requests_for(SCENARIO)[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True
    error = json.loads(result["content"])
    assert (error["code"], error["reason"], error["by"]) == ("denied", "use your head", me)


async def test_undecided_call_is_denied_when_the_approval_timeout_passes(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await _create(cluster, _manifest(cluster, "timeout", approvalTimeoutSeconds=1))
    final = await wait_status(cluster, "timeout", _finished)
    assert (final["phase"], final["toolCalls"]) == ("Succeeded", 0)
    error = json.loads(model.requests_for(SCENARIO)[1].body["messages"][-1]["content"][0]["content"])
    assert (error["code"], error["reason"]) == ("denied", "approval timed out")


async def test_cancel_while_awaiting_approval_ends_cancelled_and_clears_pending_approvals(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await _create(cluster, _manifest(cluster, "cancelled"))
    await wait_status(cluster, "cancelled", _awaiting)
    code, body = await _merge_patch(cluster, "cancelled", {"spec": {"cancel": True}})
    assert code == 200, body
    final = await wait_status(cluster, "cancelled", _finished)
    assert (final["phase"], final["stopReason"]) == ("Cancelled", "Cancelled")
    assert "pendingApprovals" not in final
    assert len(model.requests_for(SCENARIO)) == 1


async def test_spec_approvals_can_be_appended_but_not_removed_and_other_fields_stay_immutable(
    cluster: TestCluster,
) -> None:
    me = await cluster.whoami()
    await _create(cluster, _manifest(cluster, "schema"))
    first = {"toolUseId": "toolu_1", "decision": "approve", "by": me}
    second = {"toolUseId": "toolu_2", "decision": "deny", "by": me, "reason": "no"}
    assert (await _merge_patch(cluster, "schema", {"spec": {"approvals": [first]}}))[0] == 200
    assert (await _merge_patch(cluster, "schema", {"spec": {"approvals": [first, second]}}))[0] == 200
    code, body = await _merge_patch(cluster, "schema", {"spec": {"approvals": [second]}})
    assert code == 422 and "append-only" in body["message"]
    code, body = await _merge_patch(cluster, "schema", {"spec": {"task": "something else"}})
    assert code == 422 and "immutable" in body["message"]
    code, body = await _merge_patch(
        cluster, "schema", {"spec": {"approvals": [first, second, {"toolUseId": "x", "decision": "maybe"}]}}
    )
    assert code == 422


async def test_pending_approval_survives_an_operator_restart_and_a_decision_made_meanwhile_applies(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    me = await cluster.whoami()
    await _create(cluster, _manifest(cluster, "durable"))
    before = await wait_status(cluster, "durable", _awaiting)
    assert before["iterations"] == 1 and before["usage"]["totalTokens"] > 0
    await operator.stop(kill=True)
    await operator.start()
    # The restarted operator resumes from the stored model answer and asks again, without a new
    # model request; `since` keeps the time the wait really began.
    await until(
        lambda: operator.logs().count("is waiting for approval") >= 2,
        "the restarted operator to wait for the approval again",
        60,
    )
    assert operator.logs().count("is waiting for approval") == 2, operator.logs()
    again = await wait_status(cluster, "durable", _awaiting)
    assert again["pendingApprovals"][0]["since"] == before["pendingApprovals"][0]["since"]
    assert len(model.requests_for(SCENARIO)) == 1

    await operator.stop(kill=True)
    code, body = await _merge_patch(
        cluster,
        "durable",
        {"spec": {"approvals": [{"toolUseId": "toolu_ap1", "decision": "approve", "by": me}]}},
    )
    assert code == 200, body
    await operator.start()
    final = await wait_status(cluster, "durable", _finished)
    assert (final["phase"], final["stopReason"], final["toolCalls"], final["iterations"]) == (
        "Succeeded",
        "EndTurn",
        1,
        2,
    )
    assert "pendingApprovals" not in final
    requests = model.requests_for(SCENARIO)
    assert [len(r.body["messages"]) for r in requests] == [1, 3], operator.logs()
    result = requests[1].body["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_ap1" and '"value": 395' in result["content"]
