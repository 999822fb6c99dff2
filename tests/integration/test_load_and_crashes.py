"""Load and crash matrix: many runs through one operator, faults injected, the operator SIGKILLed at
seeded random moments. Every run reaches its correct terminal state and nothing is lost or repeated.

The crash seed is printed on failure and can be set with ``AGENTRUN_CRASH_SEED`` to replay a case.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.integration.test_durable_runs import (
    Webhook,
    assert_consistent,
    durable_script,
    webhook_manifest,
)
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.operator_process import OperatorProcess
from tests.support.transcript_stores import EACH_STORE, StoreUnderTest
from tests.support.waiting import until

# A thousand runs, and an operator killed over and over: started first in a parallel run, on the worker
# of the other loads (tests/conftest.py's SHARED_WORKER).
pytestmark = pytest.mark.slow

API_KEY = "sk-ant-load-test-0123456789"
LOAD_RUNS = int(os.environ.get("AGENTRUN_LOAD_RUNS", "1000"))
FINISHED = ("Succeeded", "Failed", "Cancelled")


def _operator(cluster: TestCluster, model: FakeMessagesAPI, log: Path, **env: str) -> OperatorProcess:
    return cluster.operator_process(
        log, {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url, **env}
    )


async def _create_all(cluster: TestCluster, manifests: list[dict[str, Any]]) -> None:
    gate = asyncio.Semaphore(16)
    async with cluster.session() as session:

        async def create(manifest: dict[str, Any]) -> None:
            async with gate, session.post(cluster.runs_path, json=manifest) as response:
                assert response.status == 201, await response.text()

        await asyncio.gather(*(create(m) for m in manifests))


async def _phases(cluster: TestCluster) -> dict[str, dict[str, Any]]:
    items = (await cluster.request("GET", cluster.runs_path))["items"]
    return {obj["metadata"]["name"]: obj for obj in items}


async def _wait_all_finished(cluster: TestCluster, count: int, timeout: float) -> dict[str, dict[str, Any]]:
    """Every run, once all ``count`` are there and finished (a failure shows how many are in each phase)."""

    async def by_phase() -> tuple[Counter[str | None], dict[str, dict[str, Any]]]:
        runs = await _phases(cluster)
        return Counter(r.get("status", {}).get("phase") for r in runs.values()), runs

    def finished(seen: tuple[Counter[str | None], dict[str, dict[str, Any]]]) -> bool:
        phases, runs = seen
        return len(runs) == count and set(phases) <= set(FINISHED)

    _, runs = await until(by_phase, f"all {count} runs to finish", timeout, done=finished, every=1.0)
    return runs


@pytest.mark.timeout(1200)
@pytest.mark.emulator_only(
    "injects 500/409/429 answers and cut watches into a thousand runs; "
    "a real server cannot be made to fail on demand"
)
async def test_a_thousand_runs_with_injected_api_faults_all_finish_and_none_is_lost_or_repeated(
    cluster: TestCluster, tmp_path: Path
) -> None:
    script = Script(
        "[load]",
        [
            Reply([tool_use_block("calculator", {"expression": "2+2"}, id="toolu_load1")]),
            Reply([text_block("4")]),
        ],
    )
    async with FakeMessagesAPI(scripts=[script], require_api_key=API_KEY).running() as model:
        faults = cluster.emulator.faults
        status = re.compile(r".*/agentruns/[^/]+/status")
        faults.add(method="PATCH", path=status, status=500, times=40)
        faults.add(method="PATCH", path=status, status=409, times=40)
        faults.add(verb="create", resource="secrets", status=500, times=25)
        faults.add(verb="create", resource="secrets", status=429, retry_after=1, times=10)
        faults.drop_watch(resource="agentruns", after_events=300, times=2)
        operator = _operator(cluster, model, tmp_path / "operator.log", AGENTRUN_MAX_CONCURRENT_RUNS="100")
        await operator.start()
        try:
            manifests = [
                agentrun(
                    f"load-{i:04d}",
                    f"[load] run {i}",
                    namespace=cluster.namespace,
                    model={"name": "claude-haiku-4-5"},
                    tools=[{"builtin": {"name": "calculator"}}],
                )
                for i in range(LOAD_RUNS)
            ]
            await _create_all(cluster, manifests)
            runs = await _wait_all_finished(cluster, LOAD_RUNS, timeout=900)
        finally:
            await operator.stop()
        outcomes = Counter(
            (s["phase"], s["iterations"], s.get("result")) for s in (r["status"] for r in runs.values())
        )
        assert outcomes == Counter({("Succeeded", 2, "4"): LOAD_RUNS})
        # No run was started twice: each run's two model steps were asked for exactly once.
        asked = Counter(
            (r.body["metadata"]["user_id"], r.step)
            for r in model.requests_for("[load]")
            if r.step is not None
        )
        assert len(asked) == 2 * LOAD_RUNS and set(asked.values()) == {1}
        assert all(rule.hits == rule.times for rule in faults.rules), "every injected fault fired"


@pytest.mark.timeout(600)
@EACH_STORE
async def test_operator_killed_at_seeded_random_moments_loses_and_repeats_nothing(
    cluster: TestCluster, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    seed = int(os.environ.get("AGENTRUN_CRASH_SEED", "20261122"))
    rng = random.Random(seed)
    runs = 8
    kills = 6
    hook = Webhook()
    await hook.start()
    api = FakeMessagesAPI(scripts=[durable_script("[crash]")], require_api_key=API_KEY, latency_seconds=0.3)
    try:
        async with api.running() as model:
            manifests = [webhook_manifest(cluster, f"crash-{i}", "[crash]", hook) for i in range(runs)]
            await _create_all(cluster, manifests)
            moments = []
            for index in range(kills):
                operator = _operator(
                    cluster, model, tmp_path / f"operator-{index}.log", **transcript_store.env
                )
                await operator.start()
                moments.append(round(rng.uniform(0.2, 2.5), 2))
                await asyncio.sleep(moments[-1])
                await operator.stop(kill=True)
            final = _operator(cluster, model, tmp_path / "operator-final.log", **transcript_store.env)
            await final.start()
            try:
                found = await _wait_all_finished(cluster, runs, timeout=180)
            finally:
                await final.stop()
    finally:
        await hook.stop()
    context = f"seed={seed} kill moments={moments}"
    for name, obj in found.items():
        status = obj["status"]
        assert (status["phase"], status["stopReason"], status["iterations"], status["toolCalls"]) == (
            "Succeeded",
            "EndTurn",
            4,
            3,
        ), f"{name}: {context}"
        assert status["transcript"]["kind"] == transcript_store.status_kind, f"{name}: {context}"
        transcript = await transcript_store.transcript(obj["metadata"]["uid"])
        assert_consistent(transcript)
        assert [row.iteration for row in transcript.trace_rows] == [1, 2, 3, 4], f"{name}: {context}"
        uid = obj["metadata"]["uid"]
        keys = Counter(k for k in hook.keys if k.startswith(f"{uid}:"))
        assert set(keys) == {f"{uid}:toolu_w{i}" for i in (1, 2, 3)}, f"{name}: {context}"
        # Re-runs only happen for the iteration in flight at a kill, so never more than kills + 1.
        assert max(keys.values()) <= kills + 1, f"{name}: {context}"
