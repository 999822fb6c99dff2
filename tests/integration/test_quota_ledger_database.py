"""AgentRunQuota ledgers in PostgreSQL (AGENTRUN_QUOTA_LEDGER=postgres) with the real operator: admission,
reservations and their settling kept in the quota's row, the quota's status a copy of the totals, on
the emulator and on the real API server, with a real PostgreSQL server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentrun.stores.quota_ledgers import TABLE
from agentrun_sandbox.messages.api import FakeMessagesAPI
from tests.integration.test_quota_replicas import cancel
from tests.integration.test_quotas import ANSWER_TOKENS, API_KEY, SCRIPTS, WAIT, phase_of, run
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request, until, wait_finished
from tests.support.operator_process import OperatorProcess
from tests.support.postgres import PostgresServer
from tests.support.quotas import create_quota, install_quota_crd, quota_status


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY)
    async with api.running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, postgres: PostgresServer, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    await install_quota_crd(cluster)
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_QUOTA_LEDGER": "postgres",
        "AGENTRUN_DATABASE_URL": postgres.dsn,
    }
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


async def ledger_row(postgres: PostgresServer) -> dict[str, object]:
    rows = await postgres.query(f"SELECT status FROM {TABLE}")
    return json.loads(rows[0]["status"]) if rows else {}


async def test_a_ledger_in_postgres_admits_in_turn_counts_usage_and_copies_its_totals_to_the_status(
    cluster: TestCluster, model: FakeMessagesAPI, postgres: PostgresServer, operator: OperatorProcess
) -> None:
    await create_quota(cluster, "team", hard={"concurrentRuns": 1, "tokens": 100000})
    await request(cluster, "POST", cluster.runs_path, json=run(cluster, "first", "[quota:held]"))
    await until(lambda: len(model.requests_for("[quota:held]")) == 1, "the first run's request", WAIT)
    await request(cluster, "POST", cluster.runs_path, json=run(cluster, "second", "[quota:answer]"))

    async def second_held_back() -> bool:
        return (await phase_of(cluster, "second"))[:2] == ("Pending", "QuotaExceeded")

    await until(second_held_back, "the second run to wait for the quota", WAIT)
    first_uid = (await cluster.get_run("first") or {})["metadata"]["uid"]
    row = await ledger_row(postgres)
    assert [entry["uid"] for entry in row["admitted"]] == [first_uid]  # type: ignore[index]
    assert len(row["reservations"]) == 1  # type: ignore[arg-type]  # the first run's request in flight

    # The quota's status: the totals, the lists' lengths, and no lists.
    status = await until(
        lambda: quota_status(cluster, "team"),
        "the copy of the ledger in the quota's status",
        WAIT,
        done=lambda s: (s.get("ledger") or {}).get("reservations") == 1,
    )
    assert status["used"]["concurrentRuns"] == 1 and status["summary"]["concurrentRuns"] == "1/1"
    assert "admitted" not in status and "reservations" not in status
    assert status["ledger"]["store"] == "postgres" and status["ledger"]["admitted"] == 1

    await cancel(cluster, "first")
    assert (await wait_finished(cluster, "first", timeout=WAIT))["status"]["phase"] == "Cancelled"
    second = (await wait_finished(cluster, "second", timeout=WAIT))["status"]
    assert (second["phase"], second["result"]) == ("Succeeded", "done")

    settled = await until(
        lambda: quota_status(cluster, "team"),
        "both runs released, the answer's tokens counted",
        WAIT,
        done=lambda s: (
            s.get("used", {}).get("runs") == 2
            and s["used"].get("concurrentRuns") == 0
            and (s.get("ledger") or {}).get("reservations") == 0
        ),
    )
    # The cancelled request is charged in full (its outcome unknown); the answer as the API reported it.
    assert settled["used"]["tokens"] >= ANSWER_TOKENS and settled["used"]["runs"] == 2
    assert settled["refused"]["runs"] == 1
    row = await ledger_row(postgres)
    assert row["admitted"] == [] and row["reservations"] == []
    assert settled["used"] == row["used"]
