"""AgentRunQuotas with the real operator: admission, per-run maxima and defaults, reservations, crashes.

Each scenario installs the AgentRunQuota CRD before the operator starts and creates its quotas in the
test namespace. Moments are chosen from what the servers show (a run's phase, the quota's ledger, the
fake Messages API's request log), never from sleeps.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import (
    Reply,
    Script,
    ScriptUsage,
    SlowResponse,
    text_block,
    tool_use_block,
)
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.commands import run_command
from tests.support.kube_requests import cancel_run, request, until, wait_finished
from tests.support.operator_process import OperatorProcess
from tests.support.postgres import PostgresServer
from tests.support.quotas import create_quota, install_quota_crd, ledger_row, quota_status
from tests.support.transcript_stores import EACH_STORE, StoreUnderTest

BIN = Path(sys.executable).parent
API_KEY = "sk-ant-quotas-test-0123456789"
MODEL = {"name": "claude-haiku-4-5", "maxTokens": 256}
HOLD = 120.0  # a model answer that comes only after the test moved on (cancel, kill)
WAIT = 60.0  # a loaded machine and a real server are slow
ANSWER_USAGE = ScriptUsage(100, 10, 0, 0)
ANSWER_TOKENS = 110

SCRIPTS = [
    Script("[quota:held]", [Reply([text_block("late")], faults=(SlowResponse(seconds=HOLD),))]),
    Script("[quota:answer]", [Reply([text_block("done")], usage=ANSWER_USAGE)]),
    Script(
        "[quota:tools]",
        [
            Reply([tool_use_block("calculator", {"expression": "1+1"})], usage=ANSWER_USAGE),
            Reply([tool_use_block("calculator", {"expression": "2+2"})], usage=ANSWER_USAGE),
            Reply([tool_use_block("calculator", {"expression": "3+3"})], usage=ANSWER_USAGE),
            Reply([text_block("six")], usage=ANSWER_USAGE),
        ],
    ),
    Script(
        "[quota:killed]",
        [Reply([text_block("survived")], usage=ANSWER_USAGE, faults=(SlowResponse(seconds=HOLD),))],
    ),
]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY)
    async with api.running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, transcript_store: StoreUnderTest, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    await install_quota_crd(cluster)
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url, **transcript_store.env}
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


@pytest.fixture
async def operator_with_ledgers_in_postgres(
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


def run(cluster: TestCluster, name: str, tag: str, **spec: Any) -> dict[str, Any]:
    return agentrun(name, f"{tag} go", namespace=cluster.namespace, model=MODEL, **spec)


async def phase_of(cluster: TestCluster, name: str) -> tuple[str | None, str | None, str]:
    """(phase, Succeeded condition reason, message)."""
    status = ((await cluster.get_run(name)) or {}).get("status") or {}
    reasons = {c["type"]: c["reason"] for c in status.get("conditions") or []}
    return status.get("phase"), reasons.get("Succeeded"), status.get("message") or ""


async def second_waits_behind_first(cluster: TestCluster, model: FakeMessagesAPI) -> None:
    """Run "first" holds the quota's one place with a model request that does not answer; run
    "second", created then, waits Pending with reason QuotaExceeded."""
    await request(cluster, "POST", cluster.runs_path, json=run(cluster, "first", "[quota:held]"))
    await until(lambda: len(model.requests_for("[quota:held]")) == 1, "the first run's request", WAIT)
    await request(cluster, "POST", cluster.runs_path, json=run(cluster, "second", "[quota:answer]"))

    async def second_held_back() -> bool:
        return (await phase_of(cluster, "second"))[:2] == ("Pending", "QuotaExceeded")

    await until(second_held_back, "the second run to wait for the quota", WAIT)


async def test_a_run_held_back_by_concurrent_runs_starts_by_itself_when_the_other_finishes(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await create_quota(cluster, "team", hard={"concurrentRuns": 1})
    await second_waits_behind_first(cluster, model)
    message = (await phase_of(cluster, "second"))[2]
    assert f"{cluster.namespace}/team" in message and "concurrentRuns" in message, message
    assert (await quota_status(cluster, "team"))["used"]["concurrentRuns"] == 1
    assert model.requests_for("[quota:answer]") == []

    # The first run ends (cancelled): its place is free, and the second starts without a nudge.
    await cancel_run(cluster, "first")
    assert (await wait_finished(cluster, "first", timeout=WAIT))["status"]["phase"] == "Cancelled"
    second = (await wait_finished(cluster, "second", timeout=WAIT))["status"]
    assert (second["phase"], second["result"]) == ("Succeeded", "done")

    async def both_released() -> bool:
        status = await quota_status(cluster, "team")
        return status.get("used", {}).get("concurrentRuns") == 0 and not status.get("admitted")

    await until(both_released, "both runs to leave concurrentRuns", WAIT)
    status = await quota_status(cluster, "team")
    assert status["used"]["runs"] == 2
    assert status["refused"]["runs"] == 1


async def test_a_run_whose_first_request_alone_passes_a_limit_ends_quota_exceeded_instead_of_waiting(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    # maxTokens alone (256) is more than the whole window allows: no window will ever have room.
    await create_quota(cluster, "tight", window="Hour", hard={"tokens": 200})
    await request(cluster, "POST", cluster.runs_path, json=run(cluster, "greedy", "[quota:answer]"))
    status = (await wait_finished(cluster, "greedy", timeout=WAIT))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "QuotaExceeded")
    message = status["message"]
    assert f"{cluster.namespace}/tight" in message and "more than the whole limit" in message, message
    assert model.requests_for("[quota:answer]") == []
    ledger = await quota_status(cluster, "tight")
    assert ledger["used"]["tokens"] == 0 and ledger["used"]["runs"] == 0 and not ledger.get("reservations")
    assert ledger["refused"]["runs"] == 1


@EACH_STORE
async def test_a_request_that_cannot_be_reserved_mid_run_is_not_sent_and_the_run_ends_quota_exceeded(
    cluster: TestCluster, model: FakeMessagesAPI, transcript_store: StoreUnderTest, operator: OperatorProcess
) -> None:
    # Room for a reservation (the request's bytes + a margin + maxTokens: about 1,650 tokens) and for
    # two answers' usage (110 each), not for a third reservation on top of them.
    await create_quota(cluster, "window", window="Hour", hard={"tokens": 1800})
    await request(cluster, "POST", cluster.runs_path, json=run(cluster, "busy", "[quota:tools]"))
    status = (await wait_finished(cluster, "busy", timeout=WAIT))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "QuotaExceeded"), status
    assert "this model request may use up to" in status["message"], status["message"]
    sent = model.requests_for("[quota:tools]")
    assert 1 <= len(sent) < 4, "the run stopped mid-way, at the request that did not fit"
    assert status["iterations"] == len(sent)
    assert status["transcript"]["kind"] == transcript_store.status_kind
    ledger = await quota_status(cluster, "window")
    # What was sent is counted at its real usage; what was refused is not, and nothing stays held.
    assert ledger["used"]["tokens"] == ANSWER_TOKENS * len(sent) <= 1800
    assert not ledger.get("reservations") and ledger["reserved"]["tokens"] == 0
    assert ledger["refused"]["requests"] == 1


async def test_a_run_above_a_per_run_maximum_ends_invalid_spec_naming_the_quota_and_the_field(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await create_quota(cluster, "caps", perRun={"tokenBudget": {"max": 1000}})
    manifest = run(cluster, "too-big", "[quota:answer]", limits={"tokenBudget": 5000})
    await request(cluster, "POST", cluster.runs_path, json=manifest)
    status = (await wait_finished(cluster, "too-big", timeout=WAIT))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidSpec")
    message = status["message"]
    assert f"{cluster.namespace}/caps" in message and "tokenBudget" in message and "1000" in message, message
    assert model.requests_for("[quota:answer]") == []


async def test_a_run_that_declares_no_limits_gets_the_quota_defaults_recorded_and_enforced(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await create_quota(
        cluster,
        "defaults",
        perRun={"tokenBudget": {"max": 100000, "default": 250}, "maxIterations": {"max": 10}},
    )
    await request(cluster, "POST", cluster.runs_path, json=run(cluster, "plain", "[quota:tools]"))
    status = (await wait_finished(cluster, "plain", timeout=WAIT))["status"]
    # The smallest default; maxIterations has none: the built-in 20, capped at the max of 10.
    assert status["quotaLimits"] == {"tokenBudget": 250, "maxIterations": 10}
    # 110 tokens an answer: the budget of 250 is spent by the third of the script's four answers.
    assert (status["phase"], status["stopReason"]) == ("Failed", "TokenBudgetExceeded")
    assert len(model.requests_for("[quota:tools]")) == 3


@EACH_STORE
async def test_an_operator_killed_mid_request_has_its_reservation_charged_once_after_the_restart(
    cluster: TestCluster, model: FakeMessagesAPI, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    await install_quota_crd(cluster)
    await create_quota(cluster, "ledger", hard={"tokens": 1_000_000})
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url, **transcript_store.env}
    first = cluster.operator_process(tmp_path / "operator-1.log", env)
    await first.start()
    second: OperatorProcess | None = None
    try:
        await request(cluster, "POST", cluster.runs_path, json=run(cluster, "crash", "[quota:killed]"))
        await until(lambda: len(model.requests_for("[quota:killed]")) == 1, "the held request", WAIT)
        held = (await quota_status(cluster, "ledger"))["reservations"]
        assert len(held) == 1, held
        await first.stop(kill=True)
        second = cluster.operator_process(tmp_path / "operator-2.log", env)
        await second.start()
        status = (await wait_finished(cluster, "crash", timeout=WAIT))["status"]
        assert (status["phase"], status["result"]) == ("Succeeded", "survived")
        assert status["transcript"]["kind"] == transcript_store.status_kind
        ledger = await quota_status(cluster, "ledger")
        reserved_tokens = held[0]["tokens"]
        assert ledger["lost"]["requests"] == 1
        assert ledger["lost"]["tokens"] == reserved_tokens
        # The lost reservation in full, plus the answer the second operator got, exactly.
        assert ledger["used"]["tokens"] == reserved_tokens + ANSWER_TOKENS
        assert not ledger.get("reservations")
        assert len(model.requests_for("[quota:killed]")) == 2
    finally:
        if second is not None:
            await second.stop()
        await first.stop()


async def test_a_new_quota_gets_its_status_from_the_operator_before_any_run(
    cluster: TestCluster, operator: OperatorProcess
) -> None:
    """Not blank columns and "no usage recorded yet" until a run comes: the serving operator writes
    the empty ledger of a quota it has never written, so `kubectl get arq` shows zeros."""
    await create_quota(cluster, "fresh", hard={"runs": 10, "tokens": 5000})

    async def recorded() -> bool:
        return bool((await quota_status(cluster, "fresh")).get("summary"))

    await until(recorded, "the operator to write the new quota's status", WAIT)
    code, out = await cluster.kubectl("get", "agentrunquota", "fresh")
    assert code == 0, out
    header, row = (line.split() for line in out.strip().splitlines())
    assert header[:5] == ["NAME", "WINDOW", "CONCURRENT", "RUNS", "TOKENS"], out
    assert row[0] == "fresh" and row[3].startswith("0/10") and row[4].startswith("0/5000"), out
    code, out, err = await run_command(
        BIN / "kubectl-agentrun",
        "quota",
        "-n",
        cluster.namespace,
        env={"KUBECONFIG": str(cluster.kubeconfig)},
    )
    assert code == 0, err
    assert "no usage recorded yet" not in out, out


async def test_a_ledger_in_postgres_admits_in_turn_counts_usage_and_copies_its_totals_to_the_status(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    postgres: PostgresServer,
    operator_with_ledgers_in_postgres: OperatorProcess,
) -> None:
    """AGENTRUN_QUOTA_LEDGER=postgres: admission, reservations and their settling kept in the quota's
    row (a real PostgreSQL server), the quota's status a copy of the totals."""
    await create_quota(cluster, "team", hard={"concurrentRuns": 1, "tokens": 100000})
    await second_waits_behind_first(cluster, model)
    first_uid = (await cluster.get_run("first") or {})["metadata"]["uid"]
    row = await ledger_row(postgres)
    assert [entry["uid"] for entry in row["admitted"]] == [first_uid]
    assert len(row["reservations"]) == 1  # the first run's request in flight

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

    await cancel_run(cluster, "first")
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
