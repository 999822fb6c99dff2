"""Kubernetes API faults injected by the emulator: nothing is lost and no run is started twice.

409 conflicts, 500s and 429s on status patches, watch streams that drop or expire, and transcript
chunk writes that fail. Each run must still finish with exact status and usage, its transcript must
be consistent, every model step must be requested once and every Idempotency-Key must arrive once.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from tests.integration.test_durable_runs import (
    API_KEY,
    Webhook,
    assert_succeeded_once_each,
    durable_script,
    steps_requested,
    webhook_manifest,
)
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request, until
from tests.support.operator_process import OperatorProcess
from tests.support.transcript_stores import secret_store

TAG = "[faults:plain]"

pytestmark = pytest.mark.emulator_only(
    "injects API faults (409/500/429 on status patches, 5xx on Secret creates, cut and expired watch "
    "streams) that a real API server cannot be made to produce on demand"
)


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    async with FakeMessagesAPI(scripts=[durable_script(TAG)], require_api_key=API_KEY).running() as api:
        yield api


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    hook = Webhook()
    await hook.start()
    try:
        yield hook
    finally:
        await hook.stop()


def _operator(cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path) -> OperatorProcess:
    return cluster.operator_process(
        tmp_path / "operator.log",
        # Tool results are flushed on their own, so every checkpoint is a chunk write that can fail;
        # progress goes to status after every iteration: more patches to refuse, more events to cut.
        env={
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_BASE_URL": model.url,
            "AGENTRUN_TRANSCRIPT_FLUSH_SECONDS": "0",
            "AGENTRUN_STATUS_INTERVAL_SECONDS": "0",
        },
    )


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    process = _operator(cluster, model, tmp_path)
    await process.start()
    try:
        yield process
    finally:
        await process.stop()


async def _run_once(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, operator: OperatorProcess, name: str
) -> None:
    await request(cluster, "POST", cluster.runs_path, json=webhook_manifest(cluster, name, TAG, webhook))
    await assert_succeeded_once_each(secret_store(cluster), webhook, name, repeated=None)
    assert steps_requested(model, TAG) == Counter({0: 1, 1: 1, 2: 1, 3: 1})
    assert operator.process is not None and operator.process.returncode is None


async def test_conflicts_errors_and_throttling_on_status_patches_lose_no_update(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, operator: OperatorProcess
) -> None:
    status_path = re.compile(r".*/agentruns/patched/status")
    faults = cluster.emulator.faults
    faults.add(method="PATCH", path=status_path, status=409, times=2)
    faults.add(method="PATCH", path=status_path, status=500, times=2)
    faults.add(method="PATCH", path=status_path, status=429, retry_after=1, times=1)
    await _run_once(cluster, model, webhook, operator, "patched")
    refused = [
        r
        for r in cluster.emulator.request_log
        if r.method == "PATCH" and status_path.fullmatch(r.path) and (r.status or 0) >= 400
    ]
    assert sorted(r.status for r in refused) == [409, 409, 429, 500, 500]


async def test_dropped_and_expired_watch_streams_neither_lose_nor_repeat_a_run(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, tmp_path: Path
) -> None:
    # Drops apply to watch requests made after they are added: add them before the operator starts.
    faults = cluster.emulator.faults
    faults.drop_watch(resource="agentruns", after_events=1)
    faults.drop_watch(resource="agentruns", after_events=2, expire=True)
    faults.drop_watch(resource="agentruns", after_seconds=0.5)
    operator = _operator(cluster, model, tmp_path)
    await operator.start()
    try:
        await _run_once(cluster, model, webhook, operator, "watched")
        # The run can finish before the third stream's half second is up; that cut must then make
        # the operator list a finished run again, which must not start it anew.
        await until(lambda: faults.rules[2].hits == 1, "the third watch stream to be cut", timeout=20)
        await until(
            lambda: (
                sum(
                    1 for r in cluster.emulator.request_log if r.verb == "watch" and r.resource == "agentruns"
                )
                >= 4
            ),
            "the operator to watch again after the third cut",
            timeout=20,
        )
        assert steps_requested(model, TAG) == Counter({0: 1, 1: 1, 2: 1, 3: 1})
    finally:
        await operator.stop()
    assert [rule.hits for rule in faults.rules] == [1, 1, 1], "every watch stream was cut"


async def test_failing_transcript_writes_are_retried_and_no_checkpoint_is_lost(
    cluster: TestCluster, model: FakeMessagesAPI, webhook: Webhook, operator: OperatorProcess
) -> None:
    faults = cluster.emulator.faults
    faults.add(verb="create", resource="secrets", status=500, times=3)
    faults.add(verb="create", resource="secrets", status=429, retry_after=1, times=1)
    faults.add(verb="create", resource="secrets", status=503, times=1)
    await _run_once(cluster, model, webhook, operator, "chunked")
    refused = [
        r
        for r in cluster.emulator.request_log
        if r.method == "POST" and r.path.endswith("/secrets") and (r.status or 0) >= 400
    ]
    assert sorted(r.status for r in refused) == [429, 500, 500, 500, 503]
