"""Loop detection through the real operator: equal answers to parallel webhook calls are not a loop,
a cycle of tool turns is.

The webhooks are real HTTP endpoints on loopback answering every POST with the same body, so the
only thing telling the two runs apart is what the model asks for, turn after turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, wait_status
from tests.support.operator_process import OperatorProcess
from tests.unit.tools.servers import Answer, WebhookReceiver

API_KEY = "sk-ant-loops-integration-0123456789"
TEAMS = ("payments", "search", "storage")
CHECK = tool_use_block("check", {"service": "web"})
RESTART = tool_use_block("restart", {"service": "web"})


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            Script(
                "[scenario:notify-teams]",
                [
                    Reply([tool_use_block("notify", {"team": team}) for team in TEAMS]),
                    Reply([text_block("Three teams notified.")]),
                ],
            ),
            Script(
                "[scenario:cycle]",
                # Twice the cycle detection needs, then an answer: a run that misses the loop succeeds.
                [*[Reply([CHECK]), Reply([RESTART])] * 4, Reply([text_block("web is fixed")])],
            ),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(default=Answer(200, {"ok": True})).running() as running:
        yield running


def webhook(name: str, receiver: WebhookReceiver, field: str) -> dict[str, Any]:
    return {
        "http": {
            "name": name,
            "description": f"{name} by {field}",
            "url": f"{receiver.url}/{name}",
            "inputSchema": {
                "type": "object",
                "properties": {field: {"type": "string"}},
                "required": [field],
            },
        }
    }


async def finished(cluster: TestCluster, name: str, timeout: float = 90.0) -> dict[str, Any]:
    return await wait_status(cluster, name, phase_in("Succeeded", "Failed"), "a final phase", timeout)


async def test_three_parallel_webhook_calls_with_equal_answers_succeed_not_loop(
    cluster: TestCluster, operator: OperatorProcess, receiver: WebhookReceiver
) -> None:
    manifest = agentrun(
        "notify-teams",
        "[scenario:notify-teams] tell every team the deploy finished",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        tools=[webhook("notify", receiver, "team")],
    )
    await cluster.request("POST", cluster.runs_path, json=manifest)
    status = await finished(cluster, "notify-teams")
    assert (status["phase"], status["stopReason"], status["result"]) == (
        "Succeeded",
        "EndTurn",
        "Three teams notified.",
    )
    assert sorted(r.body["team"] for r in receiver.received) == sorted(TEAMS)
    assert status["toolCalls"] == 3


async def test_a_run_cycling_between_two_turns_ends_loop_detected_after_going_round_twice(
    cluster: TestCluster, operator: OperatorProcess, receiver: WebhookReceiver
) -> None:
    manifest = agentrun(
        "cycling",
        "[scenario:cycle] get web healthy",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        tools=[webhook("check", receiver, "service"), webhook("restart", receiver, "service")],
    )
    await cluster.request("POST", cluster.runs_path, json=manifest)
    status = await finished(cluster, "cycling")
    assert (status["phase"], status["stopReason"]) == ("Failed", "LoopDetected")
    assert "a cycle of 2 iterations repeated over the last 4 iterations" in status["message"]
    assert '[check {"service":"web"}] -> [restart {"service":"web"}]' in status["message"]
    assert [r.path for r in receiver.received] == ["/check", "/restart", "/check", "/restart"]
    assert status["toolCalls"] == 4
