"""AgentRunQuota's sandbox limits with the real operator: a run with a sandbox waits for one, others do not.

The sandbox runs use an image no node has (imagePullPolicy Never) and a 10 s start timeout: without a
kubelet the pod never starts, so each run holds its sandbox for about ten seconds and then ends
FatalToolError, which is all the quota needs to see (a place held, then freed). Moments come from
what the servers show (phases, the quota's ledger), never from sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.api.times import parse_time
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import phase_in, until, wait_status
from tests.support.operator_process import OperatorProcess
from tests.support.quotas import create_quota, install_quota_crd, quota_status
from tests.support.rbac import grant_service_account
from tests.support.sandboxes import SANDBOX_RULES, one_command, unstartable_sandbox

API_KEY = "sk-ant-quota-sandboxes-0123456789"
WAIT = 90.0  # two sandbox start timeouts in a row, on a loaded machine or a real server


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    api = FakeMessagesAPI(
        scripts=[
            one_command("[quota:sandbox]"),
            Script("[quota:plain]", [Reply([text_block("done")])]),
        ],
        require_api_key=API_KEY,
    )
    async with api.running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    await install_quota_crd(cluster)
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


def sandbox_run(cluster: TestCluster, name: str) -> dict[str, Any]:
    return agentrun(
        name,
        "[quota:sandbox] run the tests",
        namespace=cluster.namespace,
        model={"name": "claude-haiku-4-5"},
        serviceAccountName="sandboxer",
        sandbox=unstartable_sandbox(),
    )


async def _condition(cluster: TestCluster, name: str) -> tuple[str | None, str | None, str]:
    """(phase, Succeeded condition reason, message)."""
    status = ((await cluster.get_run(name)) or {}).get("status") or {}
    reasons = {c["type"]: c["reason"] for c in status.get("conditions") or []}
    return status.get("phase"), reasons.get("Succeeded"), status.get("message") or ""


def _admitted(status: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry for entry in status.get("admitted") or []}


async def test_a_run_with_a_sandbox_waits_for_concurrent_sandboxes_while_a_run_without_one_goes_at_once(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await grant_service_account(cluster, "sandboxer", SANDBOX_RULES, probe=cluster.path("pods"))
    await create_quota(cluster, "boxes", hard={"concurrentSandboxes": 1})
    await cluster.request("POST", cluster.runs_path, json=sandbox_run(cluster, "boxed-first"))

    async def first_holds_the_sandbox() -> bool:
        return "boxed-first" in _admitted(await quota_status(cluster, "boxes"))

    await until(first_holds_the_sandbox, "the first sandbox run admitted", WAIT)
    status = await quota_status(cluster, "boxes")
    assert _admitted(status)["boxed-first"]["sandbox"] == {"cpu": "500m", "memory": "128Mi"}
    assert status["used"]["concurrentSandboxes"] == 1
    assert status["summary"]["concurrentSandboxes"] == "1/1"

    await cluster.request("POST", cluster.runs_path, json=sandbox_run(cluster, "boxed-second"))
    await cluster.request(
        "POST",
        cluster.runs_path,
        json=agentrun(
            "plain", "[quota:plain] answer", namespace=cluster.namespace, model={"name": "claude-haiku-4-5"}
        ),
    )

    async def second_held_back() -> bool:
        return (await _condition(cluster, "boxed-second"))[:2] == ("Pending", "QuotaExceeded")

    await until(second_held_back, "the second sandbox run to wait for the quota", WAIT)
    message = (await _condition(cluster, "boxed-second"))[2]
    assert message.startswith(
        f"quota {cluster.namespace}/boxes: concurrentSandboxes limit 1 reached (1 sandbox running)"
    ), message

    # The run without a sandbox is not held back: it finishes while the first still holds its sandbox.
    plain = await wait_status(cluster, "plain", phase_in("Succeeded", "Failed"), timeout=WAIT)
    assert (plain["phase"], plain["result"]) == ("Succeeded", "done")
    first = await wait_status(cluster, "boxed-first", phase_in("Succeeded", "Failed"), timeout=WAIT)
    assert (first["phase"], first["stopReason"]) == ("Failed", "FatalToolError"), first.get("message")
    first_ended = parse_time(first["completionTime"])
    plain_started = parse_time(plain["startTime"])
    assert first_ended is not None and plain_started is not None and plain_started < first_ended

    # The first run's end frees the place: the second is admitted by itself, after it.
    second = await wait_status(cluster, "boxed-second", phase_in("Succeeded", "Failed"), timeout=WAIT)
    assert (second["phase"], second["stopReason"]) == ("Failed", "FatalToolError"), second.get("message")
    second_started = parse_time(second["startTime"])
    assert second_started is not None and second_started >= first_ended.replace(microsecond=0)

    async def all_released() -> bool:
        status = await quota_status(cluster, "boxes")
        return status.get("used", {}).get("concurrentSandboxes") == 0 and not status.get("admitted")

    await until(all_released, "every run to leave the quota", WAIT)
    status = await quota_status(cluster, "boxes")
    assert status["used"]["runs"] == 3
    assert status["used"]["sandboxCPU"] == status["used"]["sandboxMemory"] == "0"
    assert status["refused"]["runs"] == 1
