"""A quota created just before a run binds it, though the quota's watch event comes later."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus, QuotaWait
from agentrun.controller.quotas.admission import AdmittedSpec, Candidate
from agentrun.controller.quotas.control import Quotas
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from tests.unit.controller.quotas.conftest import QuotaFactory


class CountingClient(KubeClient):
    """The real client, counting the quota listings it sends (each still goes to the emulator)."""

    listings = 0

    async def list_quotas(self, namespace: str | None) -> list[dict[str, Any]]:
        self.listings += 1
        return await super().list_quotas(namespace)


def spec() -> ResolvedRunSpec:
    return ResolvedRunSpec.of(AgentRunSpec.model_validate({"task": "count"}), None)


async def never_waits(reason: str, message: str, wait: QuotaWait) -> None:
    raise AssertionError(f"the run waited: {reason}: {message}")


async def test_a_new_run_is_bound_by_a_quota_created_after_its_namespace_was_listed(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    assert await quotas.gate.definitions("default") == []  # listed: no quota yet, and no watch feeds it
    await make_quota(hard={"concurrentRuns": 5})
    assert await quotas.gate.definitions("default") == []  # the view alone has not seen it

    run = Candidate("default", "new", "uid-new", created="2026-01-01T00:00:00Z")
    admitted = await quotas.gate.admit_run(
        run, spec(), AgentRunStatus(), started=False, cancel=asyncio.Event(), announce=never_waits
    )

    assert isinstance(admitted, AdmittedSpec)
    ledger = (await kube.get_quota("default", "team"))["status"]
    assert [entry["uid"] for entry in ledger["admitted"]] == ["uid-new"]
    assert ledger["used"]["runs"] == 1


async def test_a_resumed_run_asks_no_new_listing(kube: KubeClient, make_quota: QuotaFactory) -> None:
    counting = CountingClient(kube.api_client)
    quotas = Quotas(counting, Metrics(CollectorRegistry()), identity="test")
    await quotas.gate.definitions("default")
    run = Candidate("default", "resumed", "uid-resumed", created="2026-01-01T00:00:00Z")
    admitted = await quotas.gate.admit_run(
        run, spec(), AgentRunStatus(), started=True, cancel=asyncio.Event(), announce=never_waits
    )
    assert isinstance(admitted, AdmittedSpec)
    assert counting.listings == 1


async def test_new_runs_that_ask_while_a_listing_is_out_share_the_next_one(kube: KubeClient) -> None:
    counting = CountingClient(kube.api_client)
    view = Quotas(counting, Metrics(CollectorRegistry()), identity="test").view

    first = asyncio.ensure_future(view.fresh_quotas("default"))
    await asyncio.sleep(0)  # its listing is out
    during = [asyncio.ensure_future(view.fresh_quotas("default")) for _ in range(3)]
    await asyncio.gather(first, *during)
    assert counting.listings == 2  # the first's, then one for the three that asked during it

    await view.fresh_quotas("default")
    assert counting.listings == 3  # asked after both: a listing of its own
