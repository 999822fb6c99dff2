"""The operator's run slots are shared fairly: the real operator with one slot, two namespaces, the
fake Messages API's log as the order in which runs started.

Runs against the emulator and, with `--real-cluster`, a real kube-apiserver; the second namespace is
the test's own (created and deleted here), and the operator serves both.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import RUNS_API, TestCluster
from tests.support.waiting import until

API_KEY = "sk-ant-fair-queue-0123456789"
HOLD = "[scenario:fair-hold]"
WORK = "[scenario:fair-work]"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                HOLD,
                [
                    Reply([tool_use_block("calculator", {"expression": "1+1"}, id="toolu_hold")]),
                    Reply([text_block("held")]),
                ],
            ),
            Script(WORK, [Reply([text_block("done")])]),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def other_namespace(cluster: TestCluster) -> AsyncIterator[str]:
    """A second namespace of the test's own (on a real server next to the fixture's)."""
    name = f"fairqueue-{secrets.token_hex(4)}"
    await cluster.request(
        "POST", "/api/v1/namespaces", json={"metadata": {"name": name, "labels": {"agentrun-e2e": "1"}}}
    )
    try:
        yield name
    finally:
        await cluster.status_of("DELETE", f"/api/v1/namespaces/{name}")


def runs_path(namespace: str) -> str:
    return f"{RUNS_API}/namespaces/{namespace}/agentruns"


async def statuses(cluster: TestCluster, namespace: str) -> dict[str, dict[str, Any]]:
    listed = await cluster.request("GET", runs_path(namespace))
    return {item["metadata"]["name"]: item.get("status") or {} for item in listed["items"]}


async def eventually(
    cluster: TestCluster,
    namespaces: list[str],
    check: Callable[[dict[str, dict[str, Any]]], bool],
    what: str,
    timeout: float = 90.0,
) -> dict[str, dict[str, Any]]:

    async def look() -> dict[str, dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for namespace in namespaces:
            seen.update(await statuses(cluster, namespace))
        return seen

    def summary(seen: dict[str, dict[str, Any]]) -> str:
        return json.dumps(
            {name: (s.get("phase"), s.get("queuePosition"), s.get("message")) for name, s in seen.items()},
            indent=1,
        )

    found: dict[str, dict[str, Any]] = await until(
        look, what, timeout, done=check, every=0.2, explain=summary
    )
    return found


def positions(seen: dict[str, dict[str, Any]]) -> dict[str, int | None]:
    return {name: status.get("queuePosition") for name, status in seen.items() if name != "holder"}


async def test_a_lone_run_of_one_namespace_starts_before_most_of_anothers_queued_runs_in_priority_order(
    cluster: TestCluster, model: FakeMessagesAPI, other_namespace: str, tmp_path: Path
) -> None:
    a, b = cluster.namespace, other_namespace
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_MAX_CONCURRENT_RUNS": "1",
        "AGENTRUN_STATUS_INTERVAL_SECONDS": "1",
    }
    me = await cluster.whoami()
    async with cluster.operator(tmp_path / "operator.log", env, ("--namespace", a, "--namespace", b)):
        # The only slot is held by a run waiting for approval, until the test lets it go.
        holder = agentrun(
            "holder",
            f"{HOLD} hold the slot",
            namespace=a,
            model={"name": "claude-haiku-4-5"},
            tools=[{"builtin": {"name": "calculator"}, "requiresApproval": True}],
        )
        await cluster.request("POST", runs_path(a), json=holder)
        await eventually(
            cluster, [a], lambda s: s["holder"].get("phase") == "AwaitingApproval", "the holder to wait"
        )

        queued_a = [f"a{i}" for i in range(6)]
        for name in queued_a:
            await cluster.request("POST", runs_path(a), json=agentrun(name, f"{WORK} {name}", namespace=a))
        urgent = agentrun("a-urgent", f"{WORK} a-urgent", namespace=a, priority=10)
        await cluster.request("POST", runs_path(a), json=urgent)
        every_a = ["a-urgent", *queued_a]
        seen = await eventually(
            cluster,
            [a],
            lambda s: [positions(s).get(n) for n in every_a] == list(range(1, 8)),
            "a's runs to show their places, the urgent one first",
        )
        first = seen["a0"]
        assert first["phase"] == "Pending"
        reconciling = next(c for c in first["conditions"] if c["type"] == "Reconciling")
        assert reconciling["reason"] == "Queued"
        assert reconciling["message"] == "position 2 in the operator's queue (1 run slot busy)"

        # Priority may change while a run waits: a4 moves ahead of the older runs of its namespace.
        code, body = await cluster.status_of(
            "PATCH",
            f"{runs_path(a)}/a4",
            data=json.dumps({"spec": {"priority": 5}}),
            headers=MERGE_PATCH,
        )
        assert code == 200, body
        in_a = ["a-urgent", "a4", "a0", "a1", "a2", "a3", "a5"]
        await eventually(
            cluster,
            [a],
            lambda s: [positions(s).get(n) for n in in_a] == list(range(1, 8)),
            "a4 to move up to second",
        )

        # Namespace b's one run goes next but one: a's turn, then b's.
        await cluster.request("POST", runs_path(b), json=agentrun("b-lone", f"{WORK} b-lone", namespace=b))
        expected = ["a-urgent", "b-lone", *in_a[1:]]
        await eventually(
            cluster,
            [a, b],
            lambda s: [positions(s).get(n) for n in expected] == list(range(1, 9)),
            "b's run to be second and a's others one place further back",
        )

        code, body = await cluster.status_of(
            "PATCH",
            f"{runs_path(a)}/holder",
            data=json.dumps(
                {"spec": {"approvals": [{"toolUseId": "toolu_hold", "decision": "approve", "by": me}]}}
            ),
            headers=MERGE_PATCH,
        )
        assert code == 200, body
        done = await eventually(
            cluster,
            [a, b],
            lambda s: len(s) == 9 and all(x.get("phase") == "Succeeded" for x in s.values()),
            "every run to succeed",
            timeout=180,
        )

    started = [r.first_user_text.split()[-1] for r in model.requests_for(WORK)]
    assert started == expected, "one slot: the runs started one after another, in the queue's order"
    assert all("queuePosition" not in status for status in done.values()), "cleared once running"
