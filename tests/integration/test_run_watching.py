"""Who watches the runs: the operator's own watch (controller/agentruns/watching.py) with exact namespace
names, Kopf's handler with a namespace pattern; either way a run is served from creation to its end.

Runs against the emulator and, with `--real-cluster`, a real kube-apiserver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import wait_finished

API_KEY = "sk-ant-run-watching-0123456789"
SCENARIO = "[scenario:watching]"


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                SCENARIO,
                [
                    Reply([tool_use_block("calculator", {"expression": "6*7"}, id="toolu_watch")]),
                    Reply([text_block("42")]),
                ],
            )
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


def run_manifest(name: str, namespace: str) -> dict[str, object]:
    return agentrun(
        name,
        f"{SCENARIO} what is six times seven?",
        namespace=namespace,
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "calculator"}}],
    )


async def test_with_a_namespace_pattern_kopf_serves_the_runs_of_matching_namespaces(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    pattern = ("--namespace", f"{cluster.namespace[:-1]}*")
    async with cluster.operator(tmp_path / "operator.log", env, pattern) as operator:
        await cluster.request("POST", cluster.runs_path, json=run_manifest("patterned", cluster.namespace))
        run = await wait_finished(cluster, "patterned", timeout=90)
    assert (run["status"]["phase"], run["status"]["iterations"]) == ("Succeeded", 2)
    log = operator.log_path.read_text()
    assert "AgentRuns are watched through Kopf (namespace patterns: " in log
    assert "watched by the operator's own watch" not in log


@pytest.mark.emulator_only("reads the emulator's request log to see who watched the runs")
async def test_with_exact_namespaces_the_operator_watches_the_runs_itself_and_kopf_does_not(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    assert cluster.emulator is not None
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    args = ("--namespace", cluster.namespace)
    async with cluster.operator(tmp_path / "operator.log", env, args) as operator:
        await cluster.request("POST", cluster.runs_path, json=run_manifest("exact", cluster.namespace))
        run = await wait_finished(cluster, "exact", timeout=90)
    assert run["status"]["phase"] == "Succeeded"
    assert "AgentRuns are watched by the operator's own watch" in operator.log_path.read_text()
    watchers = {
        (r.user_agent or "").split("/")[0]
        for r in cluster.emulator.request_log
        if r.resource == "agentruns" and r.verb == "watch"
    }
    assert watchers == {"agentrun-operator"}
