"""`kubectl agentrun` as users run it: the installed executable (and kubectl's plugin discovery)
against the scenario's API server (the emulator, or a real one with `--real-cluster`), with the real
operator running the loops.

Decisions are recorded in the requester's own name (asked from the server): a shared real server may
have the approval policy installed cluster-wide, which admits no other name.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request, wait_status
from tests.support.operator_process import OperatorProcess

API_KEY = "sk-ant-plugin-0123456789"
SCENARIO = "[scenario:plugin-calc]"
BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-agentrun"


@dataclass
class Ran:
    code: int
    out: str
    err: str


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                SCENARIO,
                [
                    Reply(
                        [
                            text_block("Let me compute that."),
                            tool_use_block("calculator", {"expression": "17*23+4"}, id="toolu_pl1"),
                        ],
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


async def plugin(cluster: TestCluster, *args: str, via_kubectl: bool = False) -> Ran:
    """The plugin as a user runs it whose kubeconfig context names the test namespace."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "KUBECONFIG"))},
        "KUBECONFIG": str(cluster.kubeconfig_in_namespace()),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    if via_kubectl:
        kubectl = shutil.which("kubectl", path=env["PATH"])
        assert kubectl is not None, "kubectl is part of the development tools"
        command = [kubectl, "agentrun", *args]
    else:
        command = [str(PLUGIN), *args]
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


def _awaiting(status: dict[str, Any]) -> bool:
    return status.get("phase") == "AwaitingApproval"


def _finished(status: dict[str, Any]) -> bool:
    return status.get("phase") in ("Succeeded", "Failed", "Cancelled")


def _manifest(cluster: TestCluster, name: str) -> dict[str, Any]:
    return agentrun(
        name,
        f"{SCENARIO} how many pods run on 17 nodes?",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}],
    )


async def _with_pending(cluster: TestCluster, name: str, *ids: str) -> None:
    """A run whose status lists pending calls, as the operator would write it (no operator needed)."""
    await request(cluster, "POST", cluster.runs_path, json=_manifest(cluster, name))
    pending = [
        {
            "toolUseId": i,
            "toolName": "calculator",
            "input": {"expression": "1+1"},
            "since": "2025-01-01T00:00:00Z",
        }
        for i in ids
    ]
    await request(
        cluster,
        "PATCH",
        f"{cluster.runs_path}/{name}/status",
        data=json.dumps({"status": {"phase": "AwaitingApproval", "pendingApprovals": pending}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )


async def test_approve_without_an_id_decides_the_only_pending_call_and_the_run_succeeds(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    me = await cluster.whoami()  # kube-emulator on the emulator, admin on the real server
    await request(cluster, "POST", cluster.runs_path, json=_manifest(cluster, "calc"))
    await wait_status(cluster, "calc", _awaiting)
    ran = await plugin(cluster, "approve", "calc", "--reason", "looks safe")
    assert ran.code == 0, ran.err
    assert ran.out == f"agentrun.agentrun.dev/calc: approved calculator (toolu_pl1) as {me}\n"
    final = await wait_status(cluster, "calc", _finished)
    assert (final["phase"], final["toolCalls"]) == ("Succeeded", 1)
    obj = await request(cluster, "GET", f"{cluster.runs_path}/calc")
    assert obj["spec"]["approvals"] == [
        {"toolUseId": "toolu_pl1", "decision": "approve", "by": me, "reason": "looks safe"}
    ]

    transcript = await plugin(cluster, "transcript", "calc")
    assert transcript.code == 0, transcript.err
    text = transcript.out
    assert "[1] user\n    [scenario:plugin-calc] how many pods run on 17 nodes?" in text
    assert "[2] assistant\n    Let me compute that.\n    -> call calculator (toolu_pl1)" in text
    assert '"expression": "17*23+4"' in text
    assert "<- result of calculator (toolu_pl1)" in text and "395" in text
    assert "[4] assistant\n    There are 395 pods." in text
    assert "finished: EndTurn" in text

    trace = await plugin(cluster, "trace", "calc")
    assert trace.code == 0, trace.err
    header, first, second = trace.out.splitlines()
    assert header.split() == ["ITER", "STOP", "REASON", "IN", "OUT", "CACHE", "W", "CACHE", "R", "TOOLS"]
    assert first.split()[:7] == ["1", "tool_use", "120", "30", "0", "0", "calculator"]
    assert first.split()[7] == "ok" and first.endswith("ms")
    assert second.split() == ["2", "end_turn", "160", "12", "0", "0", "-"]

    raw = json.loads((await plugin(cluster, "trace", "calc", "-o", "json")).out)
    assert [row["stop_reason"] for row in raw] == ["tool_use", "end_turn"]


async def test_deny_through_kubectl_plugin_discovery_shows_the_error_in_the_transcript(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await request(cluster, "POST", cluster.runs_path, json=_manifest(cluster, "nope"))
    await wait_status(cluster, "nope", _awaiting)
    ran = await plugin(
        cluster,
        "deny",
        "nope",
        "toolu_pl1",
        "--reason",
        "do it by hand",
        "-n",
        cluster.namespace,
        via_kubectl=True,
    )
    assert ran.code == 0, ran.err
    assert "denied calculator (toolu_pl1)" in ran.out
    final = await wait_status(cluster, "nope", _finished)
    assert (final["phase"], final["toolCalls"]) == ("Succeeded", 0)
    text = (await plugin(cluster, "transcript", "nope", via_kubectl=True)).out
    assert "<- error of calculator (toolu_pl1)" in text and "do it by hand" in text
    trace = (await plugin(cluster, "trace", "nope")).out.splitlines()
    assert "calculator error(denied)" in trace[1]


async def test_approve_refuses_to_guess_between_several_pending_calls(cluster: TestCluster) -> None:
    me = await cluster.whoami()
    await _with_pending(cluster, "two", "toolu_a", "toolu_b")
    ran = await plugin(cluster, "approve", "two")
    assert ran.code == 1
    assert "2 calls awaiting approval" in ran.err and "toolu_a" in ran.err and "toolu_b" in ran.err
    # --by names the requester: under the approval policy (cluster-wide on a shared real server) no
    # one else's name is admitted; test_approval_integrity.py shows another name refused, or recorded.
    ran = await plugin(cluster, "approve", "two", "toolu_b", "--by", me)
    assert ran.code == 0, ran.err
    ran = await plugin(cluster, "deny", "two", "toolu_a")
    assert ran.code == 0, ran.err
    approvals = (await request(cluster, "GET", f"{cluster.runs_path}/two"))["spec"]["approvals"]
    assert approvals == [
        {"toolUseId": "toolu_b", "decision": "approve", "by": me},
        {"toolUseId": "toolu_a", "decision": "deny", "by": me},
    ]


async def test_deciding_a_call_that_is_not_pending_is_an_error(cluster: TestCluster) -> None:
    await _with_pending(cluster, "one", "toolu_a")
    ran = await plugin(cluster, "deny", "one", "toolu_zzz")
    assert ran.code == 1 and "toolu_zzz is not awaiting approval" in ran.err and "toolu_a" in ran.err
    await request(cluster, "POST", cluster.runs_path, json=_manifest(cluster, "idle"))
    ran = await plugin(cluster, "approve", "idle")
    assert ran.code == 1 and "no tool call awaiting approval" in ran.err


async def test_cancel_sets_spec_cancel_and_unknown_runs_are_reported(cluster: TestCluster) -> None:
    await request(cluster, "POST", cluster.runs_path, json=_manifest(cluster, "stop-me"))
    ran = await plugin(cluster, "cancel", "stop-me")
    assert (ran.code, ran.out) == (0, "agentrun.agentrun.dev/stop-me cancel requested\n")
    assert (await request(cluster, "GET", f"{cluster.runs_path}/stop-me"))["spec"]["cancel"] is True
    ran = await plugin(cluster, "cancel", "ghost")
    assert ran.code == 1 and f"agentrun {cluster.namespace}/ghost not found" in ran.err
    ran = await plugin(cluster, "transcript", "ghost", "--namespace", "elsewhere")
    assert ran.code == 1 and "agentrun elsewhere/ghost not found" in ran.err


async def test_transcript_of_a_run_that_has_not_started_says_so(cluster: TestCluster) -> None:
    await request(cluster, "POST", cluster.runs_path, json=_manifest(cluster, "fresh"))
    ran = await plugin(cluster, "transcript", "fresh")
    assert (ran.code, ran.out) == (0, f"agentrun {cluster.namespace}/fresh has no stored transcript yet\n")


async def test_a_decision_the_api_server_rejects_is_reported_not_retried(cluster: TestCluster) -> None:
    await _with_pending(cluster, "long", "toolu_a")
    ran = await plugin(cluster, "deny", "long", "--reason", "x" * 5000)
    assert ran.code == 1
    assert "HTTP 422" in ran.err and "reason" in ran.err and "kept changing" not in ran.err
    assert "approvals" not in (await request(cluster, "GET", f"{cluster.runs_path}/long"))["spec"]
