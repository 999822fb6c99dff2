"""A quota created just before a run binds it, though the quota's watch event comes later."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus, QuotaWait
from agentrun.controller.quotas.admission import AdmittedSpec, Candidate
from agentrun.controller.quotas.control import Quotas
from agentrun.controller.quotas.watching import QuotaListingFailed
from agentrun.kube.calling import KubeClient
from agentrun.metrics.definitions import Metrics
from agentrun_sandbox.kube import EmulatedCluster
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
    mark = quotas.view.mark("default")  # the run came
    admitted = await quotas.gate.admit_run(
        run, spec(), AgentRunStatus(), started=False, cancel=asyncio.Event(), announce=never_waits, mark=mark
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
        run, spec(), AgentRunStatus(), started=True, cancel=asyncio.Event(), announce=never_waits, mark=None
    )
    assert isinstance(admitted, AdmittedSpec)
    assert counting.listings == 1


async def test_runs_that_come_while_a_listing_is_out_share_the_next_one(kube: KubeClient) -> None:
    counting = CountingClient(kube.api_client)
    view = Quotas(counting, Metrics(CollectorRegistry()), identity="test").view

    first = view.mark("default")  # its listing starts at once
    await asyncio.sleep(0)  # and is out
    during = [view.mark("default") for _ in range(3)]
    assert counting.listings == 1
    await asyncio.gather(*(view.fresh_quotas("default", mark) for mark in [first, *during]))
    assert counting.listings == 2  # the first's, then one sent after the three that came during it

    await view.fresh_quotas("default", during[0])  # answered by what was listed since: no new listing
    assert counting.listings == 2
    await view.fresh_quotas("default", view.mark("default"))
    assert counting.listings == 3


async def test_a_listing_that_failed_answers_no_run_and_the_next_ask_lists_again(
    cluster: EmulatedCluster, kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"concurrentRuns": 5})
    cluster.emulator.faults.add(verb="list", resource="agentrunquotas", status=503, times=1)
    view = Quotas(kube, Metrics(CollectorRegistry()), identity="test").view

    mark = view.mark("default")
    with pytest.raises(QuotaListingFailed, match="cannot list the AgentRunQuotas of default"):
        await view.fresh_quotas("default", mark)
    assert view.cached("default") == []  # nothing passed for listed

    assert [quota["metadata"]["name"] for quota in await view.fresh_quotas("default", mark)] == ["team"]
