"""Context management through the real operator: a run whose tool results outgrow the window compacts.

The model's window comes from the operator's own override (AGENTRUN_CONTEXT_WINDOWS), and the fake
Messages API refuses any request above that window as the real API does, so the run succeeds only
if the operator really keeps what it sends within it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.loop.windowing import SUMMARY_REQUEST
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, SlowResponse, text_block, tool_use_block
from agentrun_sandbox.messages.wire import estimate_input_tokens
from tests.integration.test_plugin import plugin
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import FINISHED, phase_in, wait_status
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import until
from tests.unit.tools.servers import Answer, WebhookReceiver

API_KEY = "sk-ant-context-integration-0123456789"
MODEL = "fake-small-window-1"
WINDOW = 40_000
LOG = "E0412 OOMKilled: container web exceeded its memory limit\n" * 850  # about 50 KB per answer
CALLS = 6
HOLD = 120.0  # the answer after the first compaction comes only after the operator was killed


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    steps = [Reply([tool_use_block("fetch_log", {"pod": f"web-{i}"})]) for i in range(CALLS)]
    api = FakeMessagesAPI(
        scripts=[
            Script(
                "[scenario:big-logs]",
                [*steps, Reply([text_block("Every web pod was OOMKilled.")])],
                context_window=WINDOW,
            ),
            Script(
                "[scenario:restart]",
                [
                    *steps[:3],
                    # Three results reach the threshold: this request follows the first compaction.
                    Reply(
                        [tool_use_block("fetch_log", {"pod": "web-3"})], faults=(SlowResponse(seconds=HOLD),)
                    ),
                    *steps[4:],
                    Reply([text_block("Every web pod was OOMKilled.")]),
                ],
                context_window=WINDOW,
            ),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


def _env(model: FakeMessagesAPI, tmp_path: Path) -> dict[str, str]:
    # The model is the operator's own (its price table knows the name), with a small window.
    prices = tmp_path / "prices.yaml"
    prices.write_text('prices: [{model: "fake-small-window*", input: 1, output: 5}]\n')
    return {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_PRICE_FILE": str(prices),
        "AGENTRUN_CONTEXT_WINDOWS": f"fake-small-window*={WINDOW}",
        "AGENTRUN_STATUS_INTERVAL_SECONDS": "0",
    }


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    async with cluster.operator(tmp_path / "operator.log", _env(model, tmp_path)) as process:
        yield process


def _manifest(cluster: TestCluster, name: str, tag: str, url: str) -> dict[str, Any]:
    webhook = {
        "name": "fetch_log",
        "description": "Returns the log of a pod.",
        "url": url,
        "inputSchema": {"type": "object", "properties": {"pod": {"type": "string"}}},
    }
    return agentrun(
        name,
        f"{tag} find out why the web pods restart",
        namespace=cluster.namespace,
        model={"name": MODEL},
        tools=[{"http": webhook}],
        limits={"maxToolResultChars": 60_000},
    )


def _asks_summary(body: dict[str, Any]) -> bool:
    last = body["messages"][-1]["content"]
    texts = [b.get("text", "") for b in last if isinstance(b, dict) and b.get("type") == "text"]
    return bool(texts) and str(texts[-1]).startswith(SUMMARY_REQUEST)


def _summary_requests(model: FakeMessagesAPI, tag: str) -> list[str]:
    """The summary requests of a scenario, as the conversation they asked to summarize (to spot repeats)."""
    return [
        json.dumps(r.body["messages"], sort_keys=True)
        for r in model.requests_for(tag)
        if _asks_summary(r.body)
    ]


async def _finished(cluster: TestCluster, name: str, timeout: float = 90.0) -> dict[str, Any]:
    return await wait_status(cluster, name, phase_in(*FINISHED), "a final phase", timeout)


async def _events(
    cluster: TestCluster, name: str, reason: str, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """The run's Events with ``reason``, once there is one."""

    async def events() -> list[dict[str, Any]]:
        items = (await cluster.request("GET", cluster.path("events")))["items"]
        return [e for e in items if e["involvedObject"].get("name") == name and e["reason"] == reason]

    found: list[dict[str, Any]] = await until(events, f"a {reason} Event of {name}", timeout, every=0.25)
    return found


async def test_a_run_reading_big_logs_compacts_within_the_window_and_succeeds_visibly(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    async with WebhookReceiver(default=Answer(200, {"log": LOG})).running() as receiver:
        manifest = _manifest(cluster, "big-logs", "[scenario:big-logs]", f"{receiver.url}/logs")
        await cluster.request("POST", cluster.runs_path, json=manifest)
        status = await _finished(cluster, "big-logs")
        assert len(receiver.received) == CALLS
    assert (status["phase"], status["stopReason"]) == ("Succeeded", "EndTurn"), status.get("message")
    assert status["result"] == "Every web pod was OOMKilled."
    context = status["context"]
    assert context["compactions"] >= 1
    assert context["tokensAfter"] < context["tokensBefore"]
    assert context["tokensRemoved"] >= context["tokensBefore"] - context["tokensAfter"]
    # Every request the model got fit its window; one of them asked for the summary.
    requests = model.requests_for("[scenario:big-logs]")
    assert requests and all(estimate_input_tokens(r.body) <= WINDOW for r in requests)
    assert len(requests) == CALLS + 1 + context["compactions"]

    [event] = await _events(cluster, "big-logs", "ContextCompacted")
    assert event["type"] == "Normal" and event["count"] == context["compactions"]
    assert "turns summarized" in event["message"]

    scrape = await operator.scrape()
    compactions = [
        line for line in scrape.splitlines() if line.startswith("agentrun_context_compactions_total ")
    ]
    assert compactions and float(compactions[0].split()[1]) == context["compactions"]

    trace = await plugin(cluster, "trace", "big-logs")
    assert trace.code == 0, trace.err
    rows = [line for line in trace.out.splitlines() if "context compacted" in line]
    assert len(rows) == context["compactions"]
    assert rows[0].split()[1] == "compaction"
    # The stored transcript keeps every log whole: compaction changed what was sent, not what was kept.
    transcript = await plugin(cluster, "transcript", "big-logs")
    assert transcript.code == 0, transcript.err
    assert transcript.out.count("OOMKilled: container web exceeded") == CALLS * LOG.count("\n")
    assert "cleared to save context" not in transcript.out


async def test_an_operator_killed_after_a_compaction_resumes_compacted_without_asking_for_the_summary_again(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> None:
    tag = "[scenario:restart]"
    first = cluster.operator_process(tmp_path / "operator-0.log", _env(model, tmp_path))
    second = cluster.operator_process(tmp_path / "operator-1.log", _env(model, tmp_path))
    async with WebhookReceiver(default=Answer(200, {"log": LOG})).running() as receiver:
        try:
            await first.start()
            await cluster.request(
                "POST", cluster.runs_path, json=_manifest(cluster, "restarts", tag, f"{receiver.url}/logs")
            )
            await until(
                lambda: any("<summary turns=" in json.dumps(r.body) for r in model.requests_for(tag)),
                "a request after a compaction to reach the model",
                60,
                every=0.1,
            )
            assert len(_summary_requests(model, tag)) == 1
            await first.stop(kill=True)
            await second.start()
            status = await _finished(cluster, "restarts")
        finally:
            await first.stop()
            await second.stop()
    assert (status["phase"], status["stopReason"]) == ("Succeeded", "EndTurn"), status.get("message")
    asked = _summary_requests(model, tag)
    # Every compaction asked for its summary once; the one before the kill was not asked again.
    assert len(asked) == status["context"]["compactions"] == len(set(asked))
    held = [r for r in model.requests_for(tag) if r.step == 3 and not _asks_summary(r.body)]
    assert [r.outcome for r in held] == ["slow_response", "reply"]
    assert all("<summary turns=" in json.dumps(r.body["messages"][0]) for r in held)
