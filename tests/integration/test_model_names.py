"""A model name the operator does not know gets one answer, early, whatever else the run sets.

The operator's price table (built-in, plus AGENTRUN_PRICE_FILE) is its list of model names: a run
whose model it does not know ends InvalidSpec before any model request, with a message naming the
model and how to add a price, with or without costBudgetUSD or a costUSD quota. A run with its own
baseURL calls a gateway that names its own models: it runs (unpriced) as before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, ScriptUsage, text_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.kube_requests import request, wait_finished
from tests.support.operator_process import OperatorProcess
from tests.support.quotas import create_quota, install_quota_crd

API_KEY = "sk-ant-model-names-0123456789"
MISSPELT = "claude-sonet-4-6"
WAIT = 60.0

SCRIPTS = [Script("[names:answer]", [Reply([text_block("done")], usage=ScriptUsage(100, 10, 0, 0))])]


@pytest.fixture
async def model() -> AsyncIterator[FakeMessagesAPI]:
    async with FakeMessagesAPI(scripts=SCRIPTS, require_api_key=API_KEY).running() as server:
        yield server


@pytest.fixture
async def operator(
    cluster: TestCluster, model: FakeMessagesAPI, tmp_path: Path
) -> AsyncIterator[OperatorProcess]:
    await install_quota_crd(cluster)
    prices = tmp_path / "prices.yaml"
    prices.write_text('prices: [{model: "team-model*", input: 2, output: 10}]\n')
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url, "AGENTRUN_PRICE_FILE": str(prices)}
    async with cluster.operator(tmp_path / "operator.log", env) as process:
        yield process


def _run(cluster: TestCluster, name: str, model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return agentrun(name, f"[names:answer] {name}", namespace=cluster.namespace, model=model, **spec)


@pytest.mark.parametrize("configuration", ["nothing else", "costBudgetUSD", "a costUSD quota"])
async def test_a_misspelt_model_ends_invalid_spec_before_any_request_whatever_else_is_set(
    configuration: str, cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    spec: dict[str, Any] = {}
    if configuration == "costBudgetUSD":
        spec["limits"] = {"costBudgetUSD": 0.5}
    if configuration == "a costUSD quota":
        await create_quota(cluster, "dollars", hard={"costUSD": 5})
    await request(
        cluster, "POST", cluster.runs_path, json=_run(cluster, "misspelt", {"name": MISSPELT}, **spec)
    )
    status = (await wait_finished(cluster, "misspelt", timeout=WAIT))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith(
        f'spec.model.name: model "{MISSPELT}" is not in the operator\'s price table (known: team-model*, '
        "claude-opus-4-6*, "
    ), status["message"]
    assert status["message"].endswith(
        "check the name, or add a price for it with AGENTRUN_PRICE_FILE (docs/operating.md#prices)"
    )
    assert model.requests_for("[names:answer]") == []


async def test_a_model_the_operators_price_file_adds_is_known_and_priced(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    await request(cluster, "POST", cluster.runs_path, json=_run(cluster, "own", {"name": "team-model-7"}))
    status = (await wait_finished(cluster, "own", timeout=WAIT))["status"]
    assert (status["phase"], status["result"]) == ("Succeeded", "done")
    assert status["usage"]["costUSD"] == "0.000300"  # 100 × $2 + 10 × $10 per million tokens


async def test_a_run_calling_its_own_gateway_keeps_a_model_name_the_table_does_not_know(
    cluster: TestCluster, model: FakeMessagesAPI, operator: OperatorProcess
) -> None:
    gateway = {"name": "gateway/some-model", "baseURL": model.url}
    await request(cluster, "POST", cluster.runs_path, json=_run(cluster, "gateway", gateway))
    status = (await wait_finished(cluster, "gateway", timeout=WAIT))["status"]
    assert (status["phase"], status["result"]) == ("Succeeded", "done")
    assert status["usage"]["unpricedModels"] == ["gateway/some-model"]
    # With a dollar budget it needs a price, and says so before the first request.
    budget = {"costBudgetUSD": 0.5}
    await request(
        cluster, "POST", cluster.runs_path, json=_run(cluster, "gateway-budget", gateway, limits=budget)
    )
    status = (await wait_finished(cluster, "gateway-budget", timeout=WAIT))["status"]
    assert (status["phase"], status["stopReason"]) == ("Failed", "InvalidSpec")
    assert status["message"] == (
        'spec.model.name: model "gateway/some-model" has no price in the operator\'s price table, which '
        "limits.costBudgetUSD needs; add a price for it with AGENTRUN_PRICE_FILE (docs/operating.md#prices), "
        "or drop the budget"
    )
    assert len(model.requests_for("gateway-budget")) == 0
