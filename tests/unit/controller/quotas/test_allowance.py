"""A run's allowance: reservations in every quota, waiting for others to settle, refusals undone."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from prometheus_client import CollectorRegistry

from agentrun.api.usage import TokenUsage
from agentrun.controller.quotas.control import Quotas
from agentrun.kube.calling import KubeClient
from agentrun.loop.errors import QuotaRefused
from agentrun.loop.protocols import Spend
from agentrun.metrics.definitions import Metrics
from tests.unit.controller.quotas.conftest import QuotaFactory


async def test_a_request_that_fits_once_others_settle_waits_for_them_then_goes(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"tokens": 1000})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    await quotas.view.quotas("default")
    first, second = quotas.allowance("default", "a", "uid-a"), quotas.allowance("default", "b", "uid-b")
    ticket = await first.reserve(Spend(600, Decimal("0.1")))
    waiting = asyncio.create_task(second.reserve(Spend(600, Decimal("0.1"))))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await first.settle(ticket, TokenUsage(input_tokens=100, output_tokens=20), Decimal("0.01"))
    await asyncio.wait_for(waiting, 5)
    status = (await kube.get_quota("default", "team"))["status"]
    assert (status["used"]["tokens"], status["reserved"]["tokens"]) == (120, 600)
    assert [entry["holder"] for entry in status["reservations"]] == [second.holder]
    assert second.holder.startswith("test/") and second.holder != first.holder


async def test_a_request_that_can_never_fit_is_refused_and_its_other_reservations_undone(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota("a-roomy", hard={"tokens": 1_000_000})
    await make_quota("b-small", hard={"tokens": 500})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    await quotas.view.quotas("default")
    with pytest.raises(QuotaRefused) as refused:
        await quotas.allowance("default", "a", "uid-a").reserve(Spend(600, Decimal("0.1")))
    assert "default/b-small" in refused.value.message and "tokens" in refused.value.message
    roomy = (await kube.get_quota("default", "a-roomy"))["status"]
    assert roomy["reserved"]["tokens"] == 0 and roomy["used"]["tokens"] == 0
    assert not roomy.get("reservations")


async def test_an_unknown_outcome_is_charged_in_full_and_a_new_execution_charges_what_an_old_one_held(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    await make_quota(hard={"tokens": 10_000})
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    await quotas.view.quotas("default")
    old = quotas.allowance("default", "a", "uid-a")
    await old.settle(await old.reserve(Spend(300, Decimal("0.1"))), None, None)
    await old.reserve(Spend(400, Decimal("0.1")))  # its operator "dies" before the answer
    new = quotas.allowance("default", "a", "uid-a")
    assert await new.start() == 1
    assert await new.start() == 0
    status = (await kube.get_quota("default", "team"))["status"]
    assert status["used"]["tokens"] == 700 and status["reserved"]["tokens"] == 0
    assert (status["lost"]["requests"], status["lost"]["tokens"]) == (1, 400)


async def test_an_allowance_is_active_only_while_its_namespace_has_a_quota(
    kube: KubeClient, make_quota: QuotaFactory
) -> None:
    quotas = Quotas(kube, Metrics(CollectorRegistry()), identity="test")
    await quotas.view.quotas("default")
    allowance = quotas.allowance("default", "a", "uid-a")
    assert not allowance.active(), "no quota: requests go out unreserved"
    # As the watch brings it: from then on every request is reserved.
    quotas.observe("ADDED", await make_quota(hard={"tokens": 1000}))
    assert allowance.active()
    quotas.observe("DELETED", await kube.get_quota("default", "team"))
    assert not allowance.active()
