"""Fault injection: refused, throttled and slow requests, and watch streams that break."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator

import pytest

from agentrun_sandbox.kube import EmulatedCluster
from tests.support.kube_client import KubeClient
from tests.support.kube_testing import CONFIGMAPS, WIDGETS, widget


@pytest.fixture
async def client(kube: EmulatedCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient(kube.url) as client:
        await client.post(WIDGETS, widget("w1"))
        yield client


async def test_a_fault_answers_its_status_the_given_number_of_times_before_any_state_change(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    fault = kube.emulator.faults.add(
        method="PATCH", path=re.compile(r".*/status$"), status=409, times=2, reason="Conflict"
    )
    for _ in range(2):
        answer = await client.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}})
        assert answer.status == 409
        assert answer.body["reason"] == "Conflict"
        assert answer.body["kind"] == "Status"
    assert "status" not in (await client.get(f"{WIDGETS}/w1")).body
    assert (await client.patch(f"{WIDGETS}/w1/status", {"status": {"phase": "Running"}})).status == 200
    assert fault.hits == 2


async def test_a_429_fault_carries_retry_after(kube: EmulatedCluster, client: KubeClient) -> None:
    kube.emulator.faults.add(verb="create", resource="configmaps", status=429, retry_after=3)
    answer = await client.post(CONFIGMAPS, {"metadata": {"name": "c1"}})
    assert answer.status == 429
    assert answer.headers["Retry-After"] == "3"
    assert answer.body["reason"] == "TooManyRequests"
    assert answer.body["details"]["retryAfterSeconds"] == 3
    assert (await client.get(f"{CONFIGMAPS}/c1")).status == 404


async def test_faults_match_on_verb_resource_namespace_and_name(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    kube.emulator.faults.add(
        verb="get", resource="test.agentrun.dev/widgets", name="w1", status=500, times=None
    )
    assert (await client.get(f"{WIDGETS}/w1")).status == 500
    assert (await client.get(f"{WIDGETS}/w1")).status == 500
    assert (await client.get(WIDGETS)).status == 200
    kube.emulator.faults.clear()
    assert (await client.get(f"{WIDGETS}/w1")).status == 200


async def test_a_delay_without_status_slows_a_request_down_but_serves_it(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    kube.emulator.faults.add(verb="get", status=None, delay=0.3)
    started = time.monotonic()
    assert (await client.get(f"{WIDGETS}/w1")).status == 200
    assert time.monotonic() - started >= 0.3


async def test_a_watch_can_be_dropped_after_a_number_of_events(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    kube.emulator.faults.drop_watch(resource="widgets", after_events=2)
    stream = await client.watch(WIDGETS)
    await client.post(WIDGETS, widget("w2"))
    await client.post(WIDGETS, widget("w3"))
    events = await stream.rest()
    assert [e["object"]["metadata"]["name"] for e in events] == ["w1", "w2"]
    second = await client.watch(WIDGETS, {"resourceVersion": "1", "timeoutSeconds": "1"})
    assert len(await second.rest()) == 3  # the fault fired once; this watch runs until its own timeout


async def test_a_watch_can_be_dropped_after_some_seconds_with_a_410_error(
    kube: EmulatedCluster, client: KubeClient
) -> None:
    kube.emulator.faults.drop_watch(resource="widgets", after_seconds=0.3, expire=True)
    started = time.monotonic()
    stream = await client.watch(WIDGETS)
    events = await stream.rest()
    assert 0.3 <= time.monotonic() - started < 2
    assert [e["type"] for e in events] == ["ADDED", "ERROR"]
    assert events[-1]["object"]["code"] == 410
