"""Quotas under load: 200 concurrent runs across 5 namespaces with small quotas, Messages API faults and
operator SIGKILLs. No quota is ever passed, every run ends for the right reason, and what the quotas
counted matches what the fake Messages API billed.

What "matches" means, exactly: a request whose answer the operator recorded is counted at its real
usage; a request in flight when the operator was killed cannot be known (the API may have answered
it), so its reservation is charged in full and shown in ``status.lost``. Hence, per namespace:
``billed <= used`` and ``used - billed <= lost``; with no request lost, ``used == billed``.

The seed of the kill moments is printed on failure and can be set with ``AGENTRUN_QUOTA_SEED``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agentrun.api.usage import TokenUsage
from agentrun.model.pricing import PriceTable
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import HttpError, Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.clusters import TestCluster
from tests.support.operator_process import OperatorProcess
from tests.support.quotas import install_quota_crd
from tests.support.transcript_stores import EACH_STORE, StoreUnderTest
from tests.support.waiting import until

# Two hundred runs against quotas, with faults and kills: started first in a parallel run, on the
# worker of the other loads (tests/conftest.py's SHARED_WORKER).
pytestmark = pytest.mark.slow

API_KEY = "sk-ant-quota-load-0123456789"
MODEL = "claude-haiku-4-5"
QUOTAS_API = "/apis/agentrun.dev/v1alpha1"
RUNS_PER_NAMESPACE = 40
KILLS = 3
#: Small answers: a reservation holds input + maxTokens, so with the default a quota of a dozen runs
#: would have room for one request at a time.
MAX_TOKENS = 256
FINISHED = ("Succeeded", "Failed", "Cancelled")
TAG = "[qload]"

#: One run: a calculator call, then the answer. Every fourth conversation meets an overloaded API
#: first (an HTTP error: billed nothing, settled to zero).
SCRIPT = Script(
    TAG,
    [
        Reply([tool_use_block("calculator", {"expression": "2+2"}, id="toolu_q1")]),
        Reply([text_block("4")]),
    ],
)
FAULTY = Script(
    "[qload-faulty]",
    [
        Reply(
            [tool_use_block("calculator", {"expression": "2+2"}, id="toolu_q1")],
            faults=[HttpError.overloaded(times=1)],
        ),
        Reply([text_block("4")], faults=[HttpError.rate_limit(retry_after=0.1, times=1)]),
    ],
)


@dataclass
class Namespace:
    name: str
    hard: dict[str, Any]
    window: str = "Day"
    runs: list[str] = field(default_factory=list)

    @property
    def quota_path(self) -> str:
        return f"{QUOTAS_API}/namespaces/{self.name}/agentrunquotas"


def _limits(per_run_tokens: int, per_run_cost: Decimal) -> list[dict[str, Any]]:
    """Five namespaces, each held back by a different limit (the first by concurrency alone).

    A reservation is an upper bound (the request's bytes + maxTokens), several times what a request
    really uses, so the window limits are sized in runs' worth of real usage: room for a few
    reservations at once, and used up about half-way through the namespace's 40 runs. A kill charges
    every reservation in flight in full, at the dearest input rate for dollars: with six runs admitted
    at once (a line's front is admitted together) three kills could spend a dollar limit of 24 runs'
    worth before any run finished, so the dollar-only namespace runs four at a time. A token
    reservation is about five runs' worth (maxTokens alone is most of it), so three kills with even
    two in flight could spend a token limit of 30 runs' worth before any run finished (seen on the real
    API server: six runs at once left no room for one): the namespaces with a token limit run one at a
    time, where the worst three kills leave room for a whole run.
    """
    return [
        {"concurrentRuns": 3},
        {"concurrentRuns": 1, "tokens": per_run_tokens * 24},
        {"concurrentRuns": 4, "costUSD": float(per_run_cost * 24)},
        {"concurrentRuns": 5, "runs": 15},
        {"concurrentRuns": 1, "tokens": per_run_tokens * 30, "costUSD": float(per_run_cost * 26)},
    ]


@contextlib.asynccontextmanager
async def _namespaces(cluster: TestCluster, count: int) -> AsyncIterator[list[str]]:
    names = [f"{cluster.namespace}-q{i}" if cluster.real else f"quota-{i}" for i in range(count)]
    for name in names:
        await cluster.request(
            "POST", "/api/v1/namespaces", json={"metadata": {"name": name, "labels": {"agentrun-e2e": "1"}}}
        )
    try:
        yield names
    finally:
        for name in names:
            await cluster.status_of("DELETE", f"/api/v1/namespaces/{name}")


async def _create(cluster: TestCluster, manifests: list[tuple[str, dict[str, Any]]]) -> None:
    gate = asyncio.Semaphore(16)
    async with cluster.session() as session:

        async def create(path: str, manifest: dict[str, Any]) -> None:
            async with gate, session.post(path, json=manifest) as response:
                assert response.status == 201, await response.text()

        await asyncio.gather(*(create(path, m) for path, m in manifests))


async def _runs(cluster: TestCluster, namespaces: list[Namespace]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for ns in namespaces:
        items = (await cluster.request("GET", f"{QUOTAS_API}/namespaces/{ns.name}/agentruns"))["items"]
        found.update({f"{ns.name}/{o['metadata']['name']}": o for o in items})
    return found


def _reason(run: dict[str, Any]) -> str | None:
    for condition in (run.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return str(condition.get("reason"))
    return None


def _held_back(run: dict[str, Any]) -> bool:
    status = run.get("status") or {}
    return status.get("phase") == "Pending" and _reason(run) == "QuotaExceeded"


def _over(quota: dict[str, Any]) -> list[str]:
    """The limits a quota's status shows passed: used (and used + reserved) above hard."""
    hard = quota["spec"]["hard"]
    status = quota.get("status") or {}
    used, reserved = status.get("used") or {}, status.get("reserved") or {}
    problems = []
    for key in ("concurrentRuns", "runs", "tokens", "costUSD"):
        if key not in hard:
            continue
        limit = Decimal(str(hard[key]))
        spent = Decimal(str(used.get(key, 0)))
        held = spent + Decimal(str(reserved.get(key, 0)))
        if spent > limit or held > limit:
            problems.append(f"{key}: used {spent} (+reserved {held - spent}) of {limit}")
    return problems


class Watchdog:
    """Samples every quota while the runs go: a limit passed even for a moment is a failure."""

    def __init__(self, cluster: TestCluster, namespaces: list[Namespace]) -> None:
        self.cluster, self.namespaces = cluster, namespaces
        self.violations: list[str] = []
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                for ns in self.namespaces:
                    for quota in (await self.cluster.request("GET", ns.quota_path))["items"]:
                        self.violations += [
                            f"{ns.name}/{quota['metadata']['name']} {p}" for p in _over(quota)
                        ]
                self.samples += 1
            await asyncio.sleep(0.3)

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _operator(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    log: Path,
    namespaces: list[Namespace],
    store: StoreUnderTest,
) -> OperatorProcess:
    args: list[str] = []
    for ns in namespaces:
        args += ["--namespace", ns.name]
    env = {
        "ANTHROPIC_API_KEY": API_KEY,
        "ANTHROPIC_BASE_URL": model.url,
        "AGENTRUN_MAX_CONCURRENT_RUNS": "100",
        "AGENTRUN_STATUS_INTERVAL_SECONDS": "1",
        **store.env,
    }
    return cluster.operator_process(log, env, tuple(args))


async def _settled(cluster: TestCluster, namespaces: list[Namespace], timeout: float) -> dict[str, Any]:
    """Every run terminal or held back by a quota, twice in a row a second apart."""
    settled: list[bool] = []

    async def look() -> tuple[Counter[tuple[Any, Any]], dict[str, Any]]:
        runs = await _runs(cluster, namespaces)
        settled.append(
            all((r.get("status") or {}).get("phase") in FINISHED or _held_back(r) for r in runs.values())
        )
        return Counter(((r.get("status") or {}).get("phase"), _reason(r)) for r in runs.values()), runs

    _, runs = await until(
        look, "the runs to settle", timeout, done=lambda _: settled[-2:] == [True, True], every=1.0
    )
    return runs


@pytest.mark.timeout(900)
@EACH_STORE
async def test_two_hundred_runs_with_faults_and_kills_never_pass_a_quota_and_count_what_the_api_billed(
    cluster: TestCluster, transcript_store: StoreUnderTest, tmp_path: Path
) -> None:
    seed = int(os.environ.get("AGENTRUN_QUOTA_SEED", "20261124"))
    rng = random.Random(seed)
    prices = PriceTable.load(None)
    model_api = FakeMessagesAPI(scripts=[SCRIPT, FAULTY], require_api_key=API_KEY, latency_seconds=0.2)
    await install_quota_crd(cluster)
    async with model_api.running() as model, _namespaces(cluster, 5) as names:
        # One run served outside any quota tells what a run costs, so the limits bind mid-way.
        await _measure(cluster, model, names[0], tmp_path)
        per_run = sum((TokenUsage.from_dict(_counted(b.usage)) for b in model.bills), TokenUsage())
        per_run_cost = prices.cost(MODEL, per_run)
        assert per_run.total > 0 and per_run_cost is not None
        await _cleanup_measure(cluster, names[0])
        model.clear()
        namespaces = [
            Namespace(name, hard)
            for name, hard in zip(names, _limits(per_run.total, per_run_cost), strict=True)
        ]
        for ns in namespaces:
            await cluster.request(
                "POST",
                ns.quota_path,
                json={
                    "apiVersion": "agentrun.dev/v1alpha1",
                    "kind": "AgentRunQuota",
                    "metadata": {"name": "limits", "namespace": ns.name},
                    "spec": {"window": ns.window, "hard": ns.hard},
                },
            )
        manifests = []
        for ns in namespaces:
            for i in range(RUNS_PER_NAMESPACE):
                tag = "[qload-faulty]" if i % 4 == 0 else TAG
                name = f"q-{i:02d}"
                ns.runs.append(name)
                run = agentrun(
                    name,
                    f"{tag} {ns.name} run {i}",
                    namespace=ns.name,
                    model={"name": MODEL, "maxTokens": MAX_TOKENS},
                    tools=[{"builtin": {"name": "calculator"}}],
                )
                manifests.append((f"{QUOTAS_API}/namespaces/{ns.name}/agentruns", run))
        if cluster.emulator is not None:
            # The API server refuses writes now and then: a quota's ledger write meets a conflict or an
            # error and is read and applied again, never counted twice.
            faults = cluster.emulator.faults
            quota_status = re.compile(r".*/agentrunquotas/[^/]+/status")
            faults.add(method="PUT", path=quota_status, status=409, times=30)
            faults.add(method="PUT", path=quota_status, status=500, times=15)
            faults.add(method="PATCH", path=re.compile(r".*/agentruns/[^/]+/status"), status=500, times=20)
        watchdog = Watchdog(cluster, namespaces)
        watchdog.start()
        moments: list[float] = []
        try:
            await _create(cluster, manifests)
            for index in range(KILLS):
                operator = _operator(
                    cluster, model, tmp_path / f"operator-{index}.log", namespaces, transcript_store
                )
                await operator.start()
                moments.append(round(rng.uniform(1.0, 4.0), 2))
                await asyncio.sleep(moments[-1])
                await operator.stop(kill=True)
            final = _operator(cluster, model, tmp_path / "operator-final.log", namespaces, transcript_store)
            await final.start()
            try:
                runs = await _settled(cluster, namespaces, timeout=400)
                held = {name for name, run in runs.items() if _held_back(run)}
                checked_before_raise = await _check_counts(cluster, model, namespaces, runs, prices)
                # Room appears: every run held back starts by itself, in its turn, and finishes.
                for ns in namespaces:
                    await _clear_window_limits(cluster, ns)
                runs = await _settled(cluster, namespaces, timeout=400)
            finally:
                await final.stop()
        finally:
            await watchdog.stop()
        context = f"seed={seed} kill moments={moments}"
        assert watchdog.samples > 10, context
        assert watchdog.violations == [], f"{context}: {watchdog.violations[:10]}"
        outcomes = Counter(
            (name.split("/")[0], run["status"]["phase"], run["status"].get("stopReason"))
            for name, run in runs.items()
        )
        for ns in namespaces:
            mine = {k: v for k, v in outcomes.items() if k[0] == ns.name}
            assert sum(mine.values()) == RUNS_PER_NAMESPACE, (context, mine)
            allowed = {("Succeeded", "EndTurn")}
            if "tokens" in ns.hard or "costUSD" in ns.hard:
                allowed.add(("Failed", "QuotaExceeded"))
            assert {(phase, reason) for _, phase, reason in mine} <= allowed, (context, ns.hard, mine)
        # Each window limit bound: it held runs back or refused requests, and some runs succeeded
        # under it. Runs held back all ran once it was lifted.
        for ns in namespaces[1:]:
            bound = any(name.startswith(f"{ns.name}/") for name in held) or any(
                k[0] == ns.name and k[2] == "QuotaExceeded" for k in outcomes
            )
            assert bound, f"{context}: {ns.name} {ns.hard} never held a run back nor refused one"
            assert outcomes[(ns.name, "Succeeded", "EndTurn")] > 0, (context, ns.hard)
        for name in held:
            assert runs[name]["status"]["phase"] in FINISHED, name
        for name, run in runs.items():
            status = run["status"]
            if status["phase"] == "Succeeded":
                assert (status["iterations"], status.get("result")) == (2, "4"), name
                assert status["transcript"]["kind"] == transcript_store.status_kind, name
            else:
                message = next(c["message"] for c in status["conditions"] if c["type"] == "Ready")
                assert "/limits" in message, (name, message)
        assert checked_before_raise, context
        await _check_counts(cluster, model, namespaces, runs, prices)


def _counted(usage: Any) -> dict[str, int]:
    return {k: int(v) for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}


async def _measure(cluster: TestCluster, model: FakeMessagesAPI, namespace: str, tmp_path: Path) -> None:
    run = agentrun(
        "measure",
        f"{TAG} measure",
        namespace=namespace,
        model={"name": MODEL, "maxTokens": MAX_TOKENS},
        tools=[{"builtin": {"name": "calculator"}}],
    )
    await cluster.request("POST", f"{QUOTAS_API}/namespaces/{namespace}/agentruns", json=run)
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": model.url}
    async with cluster.operator(tmp_path / "measure.log", env, ("--namespace", namespace)):
        await until(
            lambda: cluster.request("GET", f"{QUOTAS_API}/namespaces/{namespace}/agentruns/measure"),
            "the measuring run to succeed",
            60,
            done=lambda got: (got.get("status") or {}).get("phase") == "Succeeded",
            every=0.3,
        )


async def _cleanup_measure(cluster: TestCluster, namespace: str) -> None:
    await cluster.request("DELETE", f"{QUOTAS_API}/namespaces/{namespace}/agentruns/measure")


async def _clear_window_limits(cluster: TestCluster, ns: Namespace) -> None:
    """Lifts the window limits (runs, tokens, costUSD) so every run held back gets room."""
    patch = [
        {"op": "remove", "path": f"/spec/hard/{key}"}
        for key in ("runs", "tokens", "costUSD")
        if key in ns.hard
    ]
    if patch:
        await cluster.request(
            "PATCH",
            f"{ns.quota_path}/limits",
            json=patch,
            headers={"Content-Type": "application/json-patch+json"},
        )


async def _check_counts(
    cluster: TestCluster,
    model: FakeMessagesAPI,
    namespaces: list[Namespace],
    runs: dict[str, dict[str, Any]],
    prices: PriceTable,
) -> bool:
    """Per namespace: billed <= used <= billed + lost (tokens and dollars); runs counted == runs started."""
    owner = {run["metadata"]["uid"]: name.split("/")[0] for name, run in runs.items()}
    billed_tokens: Counter[str] = Counter()
    billed_cost: dict[str, Decimal] = {ns.name: Decimal(0) for ns in namespaces}
    for bill in model.bills:
        ns_name = owner.get(bill.user_id or "")
        assert ns_name is not None, f"a request billed to no run of the test: {bill}"
        usage = TokenUsage.from_dict(_counted(bill.usage))
        billed_tokens[ns_name] += bill.total
        cost = prices.cost(bill.model, usage)
        assert cost is not None
        billed_cost[ns_name] += cost
    for ns in namespaces:
        quota = await cluster.request("GET", f"{ns.quota_path}/limits")
        status = quota["status"]
        used, lost = status["used"], status.get("lost") or {}
        tokens, lost_tokens = int(used.get("tokens", 0)), int(lost.get("tokens", 0))
        cost, lost_cost = Decimal(str(used.get("costUSD", "0"))), Decimal(str(lost.get("costUSD", "0")))
        where = f"{ns.name}: used {tokens} tokens ${cost}, lost {lost_tokens} ${lost_cost}"
        assert billed_tokens[ns.name] <= tokens <= billed_tokens[ns.name] + lost_tokens, (
            f"{where}, billed {billed_tokens[ns.name]}"
        )
        assert billed_cost[ns.name] <= cost <= billed_cost[ns.name] + lost_cost, (
            f"{where}, billed ${billed_cost[ns.name]}"
        )
        started = sum(
            1
            for name, run in runs.items()
            if name.startswith(f"{ns.name}/") and (run.get("status") or {}).get("startTime")
        )
        assert int(used.get("runs", 0)) == started, (
            f"{ns.name}: {used.get('runs')} runs counted, {started} started"
        )
    return True
