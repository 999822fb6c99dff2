"""spec.sandbox.idleTimeoutSeconds through the real operator, while a run waits for an approval.

The operator runs with AGENTRUN_FAULT_SANDBOX_IDLE_SECONDS=1 (tests only), so a run that sets
idleTimeoutSeconds (at least 30) has its pod deleted one second after its last sandbox call; the
scenario waits for that deletion before it approves the next call, so nothing depends on timing. The
sandbox asks for more CPU than any node has, so no node ever runs it, and the test plays the kubelet
whether or not the server has nodes: it marks each sandbox pod's container running, and each exec is
then refused (the pod is on no node) - a call that ends with an error is a call all the same.

Runs against the emulator and, with --real-cluster, a real kube-apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, until, wait_status
from tests.support.rbac import grant_service_account

API_KEY = "sk-ant-sandbox-idling-0123456789"
SCENARIO = "[scenario:sandbox-idle]"
IDLED = "agentrun.dev/sandbox-idled"
SANDBOX_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
]
NETWORK_POLICIES = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                SCENARIO,
                [
                    # The editor needs no approval: it starts the pod, and the idle count.
                    Reply(
                        [
                            tool_use_block(
                                "str_replace_based_edit_tool",
                                {"command": "create", "path": "notes.txt", "file_text": "x\n"},
                                id="toolu_edit1",
                            )
                        ]
                    ),
                    Reply([tool_use_block("bash", {"command": "cat notes.txt"}, id="toolu_bash1")]),
                    Reply([text_block("The workspace was new; I would start over.")]),
                ],
            ),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


def environment(model: FakeMessagesAPI) -> dict[str, str]:
    return {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_FAULT_SANDBOX_IDLE_SECONDS": "1",
    }


def manifest(cluster: TestCluster, name: str, **sandbox: Any) -> dict[str, Any]:
    return agentrun(
        name,
        f"{SCENARIO} read the notes",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="idler",
        sandbox={
            "image": "localhost/agentrun-sandbox-absent:none",
            "imagePullPolicy": "Never",
            "resources": {
                # No node has this much: the pod stays unscheduled, and the test's kubelet runs it.
                "requests": {"cpu": "1000", "memory": "64Mi"},
                "limits": {"cpu": "1000", "memory": "128Mi"},
            },
            "startTimeoutSeconds": 60,
            "idleTimeoutSeconds": 30,
            "requiresApproval": ["bash"],
            **sandbox,
        },
    )


async def pods_of(cluster: TestCluster, run_uid: str) -> list[dict[str, Any]]:
    pods = await cluster.request(
        "GET", cluster.path("pods"), params={"labelSelector": f"agentrun.dev/run-uid={run_uid}"}
    )
    return [pod for pod in pods["items"] if not pod["metadata"].get("deletionTimestamp")]


async def policies(cluster: TestCluster) -> list[str]:
    found = await cluster.request("GET", NETWORK_POLICIES.format(ns=cluster.namespace))
    return [p["metadata"]["name"] for p in found["items"]]


@contextlib.contextmanager
def kubelet(cluster: TestCluster) -> Iterator[list[str]]:
    """Marks every sandbox pod of the namespace running (the uids it did so for), as a kubelet would
    report it; with no node the pod stays unbound, so exec is still refused."""
    started: list[str] = []

    async def serve() -> None:
        while True:
            pods = await cluster.request(
                "GET", cluster.path("pods"), params={"labelSelector": "agentrun.dev/sandbox=true"}
            )
            for pod in pods["items"]:
                meta = pod["metadata"]
                if pod.get("status", {}).get("containerStatuses") or meta.get("deletionTimestamp"):
                    continue
                container = pod["spec"]["containers"][0]
                status = {
                    "phase": "Running",
                    "containerStatuses": [
                        {
                            "name": container["name"],
                            "image": container["image"],
                            "imageID": "",
                            "ready": True,
                            "restartCount": 0,
                            "state": {"running": {"startedAt": "2026-11-28T00:00:00Z"}},
                        }
                    ],
                }
                await cluster.request(
                    "PATCH",
                    cluster.path("pods", f"{meta['name']}/status"),
                    data=json.dumps({"status": status}),
                    headers=MERGE_PATCH,
                )
                started.append(meta["uid"])
            await asyncio.sleep(0.1)

    task = asyncio.get_running_loop().create_task(serve())
    try:
        yield started
    finally:
        if task.done():
            task.result()  # the server refused what a kubelet reports: that is the failure to show
        task.cancel()


async def approve(cluster: TestCluster, name: str, tool_use_id: str) -> None:
    decision = {"toolUseId": tool_use_id, "decision": "approve", "by": await cluster.whoami()}
    await cluster.request(
        "PATCH",
        f"{cluster.runs_path}/{name}",
        data=json.dumps({"spec": {"approvals": [decision]}}),
        headers=MERGE_PATCH,
    )


async def idled_while_awaiting_approval(cluster: TestCluster, name: str, uid: str, started: list[str]) -> str:
    """Waits for the run to ask for approval of its bash call and for its first pod to be deleted as
    idle meanwhile; the name of that pod."""
    await until(lambda: started, "the first sandbox pod running", timeout=60)
    await wait_status(cluster, name, phase_in("AwaitingApproval"), timeout=60)

    async def gone() -> bool:
        # The pod goes first, its NetworkPolicy right after (never the other way: the pod would run
        # unfenced for a moment), so the scenario waits for both.
        return not await pods_of(cluster, uid) and not await policies(cluster)

    await until(gone, "the idle sandbox pod and its NetworkPolicy deleted", timeout=60)
    run = await cluster.request("GET", f"{cluster.runs_path}/{name}")
    marked = run["metadata"].get("annotations", {}).get(IDLED)
    assert marked and marked.startswith(f"{name}-sandbox-"), run["metadata"]
    return str(marked)


async def told_and_succeeded(cluster: TestCluster, model: FakeMessagesAPI, name: str, uid: str) -> None:
    """The run ends Succeeded; the bash call was answered that the workspace is new, not run; a new
    pod ran for it, and the run's mark is gone."""
    final = await wait_status(cluster, name, phase_in("Succeeded", "Failed"), timeout=90)
    assert (final["phase"], final["stopReason"]) == ("Succeeded", "EndTurn"), final.get("message")
    [result] = model.requests_for(SCENARIO)[-1].body["messages"][-1]["content"]
    assert result["tool_use_id"] == "toolu_bash1" and result["is_error"] is True
    told = json.loads(result["content"])
    assert told["code"] == "sandbox_idled", told
    assert "deleted after 1 s without a sandbox call" in told["message"]
    assert "fresh workspace" in told["message"] and "This command was not run." in told["message"]
    run = await cluster.request("GET", f"{cluster.runs_path}/{name}")
    assert IDLED not in (run["metadata"].get("annotations") or {})


async def test_a_pod_idle_while_the_run_awaits_approval_is_deleted_and_the_next_call_told_it_is_new(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await grant_service_account(
        cluster, "idler", SANDBOX_RULES, probe=cluster.path("pods", "probe"), probe_answers=(404,)
    )
    async with cluster.operator(tmp_path / "operator.log", environment(model)) as operator:
        with kubelet(cluster) as started:
            created = await cluster.request("POST", cluster.runs_path, json=manifest(cluster, "idle"))
            uid = created["metadata"]["uid"]
            await idled_while_awaiting_approval(cluster, "idle", uid, started)
            await approve(cluster, "idle", "toolu_bash1")
            await told_and_succeeded(cluster, model, "idle", uid)
            assert len(started) == 2  # the first pod and the one the bash call started
        metrics = await operator.scrape()
    ns = cluster.namespace
    assert f'agentrun_sandbox_pods_idle_deleted_total{{namespace="{ns}"}} 1.0' in metrics
    assert f'agentrun_sandbox_pods_started_total{{namespace="{ns}",reason="idle"}} 1.0' in metrics


async def test_with_on_pod_lost_fail_a_pod_deleted_as_idle_before_an_operator_kill_does_not_fail_the_run(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    await grant_service_account(
        cluster, "idler", SANDBOX_RULES, probe=cluster.path("pods", "probe"), probe_answers=(404,)
    )
    first = cluster.operator_process(tmp_path / "operator-1.log", environment(model))
    second = cluster.operator_process(tmp_path / "operator-2.log", environment(model))
    try:
        with kubelet(cluster) as started:
            await first.start()
            run = manifest(cluster, "strict", onPodLost="Fail")
            created = await cluster.request("POST", cluster.runs_path, json=run)
            uid = created["metadata"]["uid"]
            await idled_while_awaiting_approval(cluster, "strict", uid, started)
            await first.stop(kill=True)  # its memory of the idle deletion dies with it
            await second.start()
            await approve(cluster, "strict", "toolu_bash1")
            await told_and_succeeded(cluster, model, "strict", uid)
            assert len(started) == 2
    finally:
        await first.stop()
        await second.stop()
