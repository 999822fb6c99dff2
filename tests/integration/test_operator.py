"""The real operator process against the scenario's API server and the fake Messages API."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, request, wait_finished, wait_status
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-integration-secret-0123456789"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                "[scenario:tool-then-answer]",
                [
                    Reply(
                        [tool_use_block("calculator", {"expression": "17*23+4"}, id="toolu_calc1")],
                        usage=ScriptUsage(120, 30, 0, 0),
                    ),
                    Reply([text_block("There are 395 pods.")], usage=ScriptUsage(160, 12, 0, 0)),
                ],
            )
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


async def test_applied_run_calls_one_tool_then_succeeds_with_exact_status(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    manifest = agentrun(
        "calc",
        "[scenario:tool-then-answer] how many pods?",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "calculator"}}],
    )
    await request(cluster, "POST", cluster.runs_path, json=manifest)
    obj = await wait_finished(cluster, "calc")
    status = obj["status"]
    assert status["phase"] == "Succeeded"
    assert status["stopReason"] == "EndTurn"
    assert status["iterations"] == 2
    assert status["toolCalls"] == 1
    assert status["result"] == "There are 395 pods."
    usage = status["usage"]
    assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == (280, 42, 322)
    assert usage["costUSD"] == f"{(280 * 1 + 42 * 5) / 1_000_000:.6f}"
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["startTime"] and status["completionTime"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Succeeded"]["status"], conditions["Succeeded"]["reason"]) == ("True", "EndTurn")
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Reconciling"]["status"] == "False"
    assert conditions["Stalled"]["status"] == "False"
    # The calculator really ran: its result went back to the model under the same id.
    second = model.requests_for("[scenario:tool-then-answer]")[1].body["messages"][-1]["content"][0]
    assert second["tool_use_id"] == "toolu_calc1" and '"value": 395' in second["content"]

    scrape = await operator.scrape()
    ns = cluster.namespace
    assert (
        f'agentrun_runs_finished_total{{namespace="{ns}",outcome="succeeded",stop_reason="EndTurn"}} 1.0'
        in scrape
    )
    assert f'agentrun_tokens_total{{model="claude-haiku-4-5",namespace="{ns}",type="input"}} 280.0' in scrape
    assert "agentrun_model_request_duration_seconds_count" in scrape
    assert API_KEY not in scrape and API_KEY not in operator.logs() and API_KEY not in str(obj)


async def test_finished_run_is_not_restarted_by_a_new_operator(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    def run(name: str, task: str) -> dict[str, Any]:
        return agentrun(
            name,
            task,
            namespace=cluster.namespace,
            model={"name": "claude-haiku-4-5"},
            tools=[{"builtin": {"name": "calculator"}}],
        )

    once = "[scenario:tool-then-answer] x"
    await request(cluster, "POST", cluster.runs_path, json=run("once", once))
    await wait_finished(cluster, "once")
    before = len(model.requests)
    await operator.stop()
    await operator.start()
    # A run applied after the restart finishing proves the new operator has listed (and passed over)
    # the finished one: the listing comes before any later event, and a run takes two model calls.
    await request(cluster, "POST", cluster.runs_path, json=run("probe", "[scenario:tool-then-answer] probe"))
    assert (await wait_finished(cluster, "probe"))["status"]["phase"] == "Succeeded"
    assert len(model.requests_for(once)) == 2
    assert len(model.requests) == before + 2


async def test_invalid_tool_ends_in_invalid_spec_naming_the_field(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    # The CRD refuses an unknown built-in's name at the API server; a built-in's config only the operator
    # checks.
    tools = [{"builtin": {"name": "calculator", "config": {"precision": 3}}}]
    manifest = agentrun("bad-tool", "x", namespace=cluster.namespace, tools=tools)
    await request(cluster, "POST", cluster.runs_path, json=manifest)
    status = (await wait_finished(cluster, "bad-tool"))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidSpec")
    assert "spec.tools[0].builtin.config" in status["message"]


async def test_missing_api_key_secret_keeps_the_run_pending_until_it_appears(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    process = cluster.operator_process(
        tmp_path / "operator.log", {"ANTHROPIC_BASE_URL": model.url, "AGENTRUN_SECRET_RETRY_SECONDS": "0.5"}
    )
    await process.start()
    try:
        manifest = agentrun(
            "needs-key",
            "[scenario:tool-then-answer] x",
            namespace=cluster.namespace,
            model={"name": "claude-haiku-4-5", "apiKeySecretRef": {"name": "anthropic"}},
            tools=[{"builtin": {"name": "calculator"}}],
        )
        await request(cluster, "POST", cluster.runs_path, json=manifest)
        status = await wait_status(cluster, "needs-key", phase_in("Pending"), timeout=30)
        reasons = {c["type"]: c["reason"] for c in status["conditions"]}
        assert reasons["Succeeded"] == "SecretNotFound"
        assert "anthropic" in status["message"]
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "anthropic", "namespace": cluster.namespace},
            "data": {"api-key": base64.b64encode(API_KEY.encode()).decode()},
        }
        await request(cluster, "POST", cluster.path("secrets"), json=secret)
        final = (await wait_finished(cluster, "needs-key"))["status"]
        assert final["phase"] == "Succeeded"
    finally:
        await process.stop()
