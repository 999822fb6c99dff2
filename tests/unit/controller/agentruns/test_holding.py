"""A run whose replica's membership lapsed takes no further step: no model request, no tool call, no
write. The real reconciler against the emulator and the fake Messages API (through the real SDK); the
membership is a stand-in whose tenure the test changes, as the membership thread does when it fences.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from agentrun.controller.agentruns.holding import HeldModel, HeldTool
from agentrun.controller.agentruns.queueing import FairQueue
from agentrun.controller.agentruns.reconciler import AgentRunReconciler
from agentrun.controller.agentruns.run_control import RunControl, StopCause
from agentrun.controller.agentruns.run_objects import RunObject
from agentrun.controller.agentruns.supervising import RunSupervisor
from agentrun.controller.replicas.ownership import Held
from agentrun.kube.calling import KubeClient
from agentrun.loop.protocols import ModelRequest, ToolCall
from agentrun.metrics.definitions import Metrics
from agentrun.model.anthropic_calling import ClientPool
from agentrun.model.pricing import PriceTable
from agentrun.settings import Settings
from agentrun_sandbox.kube import EmulatedCluster as KubeEmulator
from agentrun_sandbox.messages.api import FakeMessagesAPI
from agentrun_sandbox.messages.script import Reply, Script, text_block, tool_use_block
from tests.support.builders import agentrun
from tests.support.kube_requests import until
from tests.support.loop_harness import FakeTool
from tests.support.transcripts import list_chunk_objects

TAG = "[held]"


class Membership:
    """Owns every run; ``lapse()`` is a fence (and a rejoin) this event loop has not heard of yet."""

    fenced = False

    def __init__(self) -> None:
        self.tenure: int | None = 0

    def owns(self, uid: str) -> bool:
        return True

    def subscribe(self, changed: Callable[[], None]) -> None:
        """The test calls nobody: the point is a step that runs before the change is heard."""

    def lapse(self) -> None:
        self.tenure = (self.tenure or 0) + 1


def stopper() -> tuple[list[str], Callable[[], None]]:
    """What the supervisor's stop does to the run's task (cancel it), recorded."""
    stops: list[str] = []

    def stop() -> None:
        stops.append("stop")
        task = asyncio.current_task()
        assert task is not None
        task.cancel()

    return stops, stop


class Hook:
    """A webhook tool whose calls wait for ``release``; ``called`` is set when the first arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()
        self.release = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.calls += 1
        self.called.set()
        await self.release.wait()
        return web.json_response({"recorded": True})

    async def __aenter__(self) -> Hook:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


async def lapse_during(
    where: str, cluster: KubeEmulator, kube: KubeClient
) -> tuple[FakeMessagesAPI, Hook, list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs one AgentRun under a supervisor, as the run handler does with replicas, and lapses the
    membership while the first model request (``where="model"``) or the first tool call ("tool") is
    in flight. Returns the model, the hook, the stops and the transcript chunks before and after."""
    script = Script(
        TAG,
        [
            Reply([tool_use_block("record", {"step": 1}, id="toolu_1")]),
            Reply([tool_use_block("record", {"step": 2}, id="toolu_2")]),
            Reply([text_block("done")]),
        ],
    )
    membership = Membership()
    async with (
        FakeMessagesAPI(scripts=[script], latency_seconds=0.3).running() as model,
        Hook() as hook,
    ):
        settings = Settings(anthropic_api_key="sk-held", anthropic_base_url=model.url, replica_name="op-a")
        clients = ClientPool()
        reconciler = AgentRunReconciler(
            settings=settings,
            kube=kube,
            metrics=Metrics(CollectorRegistry()),
            clients=clients,
            prices=PriceTable(),
            queue=FairQueue(5),
        )
        tool = {"http": {"name": "record", "description": "Records a step.", "url": hook.url}}
        manifest = agentrun(
            f"held-{where}", f"{TAG} record", model={"name": "claude-haiku-4-5"}, tools=[tool]
        )
        created = cluster.emulator.create_object("agentruns", manifest)
        ref = RunObject.parse(created)
        stops: list[str] = []

        async def execute(run: RunObject, control: RunControl) -> None:
            def lost() -> None:
                stops.append(ref.uid)
                control.stop(StopCause.FENCED)

            control.hold(Held(membership, ref.uid, lost))  # as the run handler does, with replicas
            await reconciler.reconcile(ref, control, log=logging.getLogger("test"))

        supervisor = RunSupervisor(execute)
        supervisor.observe(None, ref)
        try:
            if where == "model":
                while not model.requests_for(TAG):
                    assert supervisor.executing() == {ref.uid}
                    await asyncio.sleep(0.01)
            else:
                await asyncio.wait_for(hook.called.wait(), 10)
            before = await list_chunk_objects(kube, "default", uid=ref.uid)
            membership.lapse()  # fenced on the membership thread while the step is in flight
            hook.release.set()
            await until(lambda: not supervisor.executing(), "the run stopped", timeout=10)
        finally:
            await supervisor.close()
            await clients.close()
        after = await list_chunk_objects(kube, "default", uid=ref.uid)
    return model, hook, stops, before, after


async def test_a_run_whose_membership_lapsed_during_a_model_request_writes_nothing_and_asks_no_more(
    cluster: KubeEmulator, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    model, hook, stops, before, after = await lapse_during("model", cluster, kube)
    assert stops and len(model.requests_for(TAG)) == 1, "a model request after the lapse"
    assert hook.calls == 0, "a tool call after the lapse"
    assert after == before, "the answer received after the lapse was written"
    status = cluster.emulator.get_object("agentruns", "default", "held-model").get("status") or {}
    assert not status.get("iterations") and status.get("phase") != "Succeeded"
    assert "failed unexpectedly" not in caplog.text


async def test_a_run_whose_membership_lapsed_during_a_tool_call_sends_no_further_model_request(
    cluster: KubeEmulator, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    model, hook, stops, before, after = await lapse_during("tool", cluster, kube)
    assert stops and len(model.requests_for(TAG)) == 1, "a model request after the lapse"
    assert hook.calls == 1
    assert after == before, "the tool results received after the lapse were written"
    assert "failed unexpectedly" not in caplog.text


async def test_a_held_model_and_tool_take_no_step_once_the_run_is_no_longer_held() -> None:
    membership = Membership()
    stops, stop = stopper()
    held = Held(membership, "uid-1", stop)
    tool = FakeTool("lookup")

    class Model:
        asked = 0

        async def complete(self, request: ModelRequest) -> Any:
            Model.asked += 1
            raise AssertionError("asked")

    call = ToolCall("toolu_1", "lookup", {}, "key", 1)
    held_tool = HeldTool(tool, held)
    assert held_tool.definition == tool.definition
    assert (await held_tool.call(call)).content == "ok" and len(tool.calls) == 1 and not stops
    membership.lapse()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(held_tool.call(call))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(HeldModel(Model(), held).complete(ModelRequest("m", 10, [])))
    assert len(tool.calls) == 1 and Model.asked == 0 and len(stops) == 2


def test_a_run_not_owned_when_it_starts_is_not_held() -> None:
    membership = Membership()
    membership.tenure = None  # fenced, or not a member yet
    stops, _ = stopper()
    assert not Held(membership, "uid-1", lambda: stops.append("stop"))()
    assert stops == ["stop"]
