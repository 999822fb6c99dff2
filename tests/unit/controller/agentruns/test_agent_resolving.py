"""The resolve_agent phase: Pending until the Agent exists, one record, and a resumed run never re-reads."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus, AgentUsed
from agentrun.api.stops import StopReason
from agentrun.controller.agentruns.agent_resolving import AgentWaiters, resolve_agent
from agentrun.controller.agentruns.phases import Ending

RUN_SPEC: dict[str, Any] = {"task": "t", "agentRef": {"name": "writer"}, "model": {"maxTokens": 100}}
RUN = AgentRunSpec.model_validate(RUN_SPEC)
NO_STATUS = AgentRunStatus()
AGENT = {
    "metadata": {"name": "writer", "uid": "u-1", "generation": 3},
    "spec": {"systemPrompt": "Write.", "model": {"name": "m", "maxTokens": 200}},
}


class Source:
    def __init__(self, agent: Mapping[str, Any] | None = None) -> None:
        self.agent = agent
        self.reads = 0
        self.read = asyncio.Event()

    async def get_agent(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        assert (namespace, name) == ("ns", "writer")
        self.reads += 1
        self.read.set()
        return self.agent


class Recorder:
    def __init__(self) -> None:
        self.announced: list[tuple[str, str]] = []
        self.recorded: list[tuple[AgentUsed, Mapping[str, Any]]] = []
        self.pending = asyncio.Event()

    async def announce(self, reason: str, message: str) -> None:
        self.announced.append((reason, message))
        self.pending.set()

    async def record(self, agent: AgentUsed, spec: Mapping[str, Any]) -> None:
        self.recorded.append((agent, spec))


async def test_a_run_without_agent_ref_keeps_its_own_spec_and_reads_nothing() -> None:
    source, recorder = Source(), Recorder()
    spec = AgentRunSpec(task="t")
    got = await resolve_agent(
        spec,
        NO_STATUS,
        namespace="ns",
        source=source,
        cancel=asyncio.Event(),
        announce=recorder.announce,
        record=recorder.record,
    )
    assert got is spec and source.reads == 0


async def test_a_found_agent_is_recorded_once_and_merged_with_the_run() -> None:
    source, recorder = Source(AGENT), Recorder()
    got = await resolve_agent(
        RUN,
        NO_STATUS,
        namespace="ns",
        source=source,
        cancel=asyncio.Event(),
        announce=recorder.announce,
        record=recorder.record,
    )
    assert got == AgentRunSpec.model_validate(
        {"task": "t", "systemPrompt": "Write.", "model": {"name": "m", "maxTokens": 100}}
    )
    assert isinstance(got, AgentRunSpec) and got.model.model_fields_set == {"name", "max_tokens"}
    assert recorder.recorded == [(AgentUsed(name="writer", uid="u-1", generation=3), AGENT["spec"])]
    assert recorder.announced == []


async def test_a_resumed_run_uses_the_recorded_spec_and_never_reads_the_agent_again() -> None:
    source, recorder = Source({**AGENT, "spec": {"systemPrompt": "Changed."}}), Recorder()
    status = AgentRunStatus.model_validate(
        {"agent": {"name": "writer", "uid": "u-1", "generation": 3}, "agentSpec": AGENT["spec"]}
    )
    got = await resolve_agent(
        RUN,
        status,
        namespace="ns",
        source=source,
        cancel=asyncio.Event(),
        announce=recorder.announce,
        record=recorder.record,
    )
    assert isinstance(got, AgentRunSpec) and got.system_prompt == "Write."
    assert source.reads == 0 and recorder.recorded == []


async def test_a_missing_agent_keeps_the_run_pending_until_an_agent_event_wakes_it() -> None:
    source, recorder, waiters = Source(), Recorder(), AgentWaiters()
    task = asyncio.create_task(
        resolve_agent(
            RUN,
            NO_STATUS,
            namespace="ns",
            source=source,
            cancel=asyncio.Event(),
            announce=recorder.announce,
            record=recorder.record,
            waiters=waiters,
            retry_seconds=3600,
        )
    )
    await asyncio.wait_for(recorder.pending.wait(), 5)
    assert recorder.announced == [
        ("AgentNotFound", "Agent writer not found in namespace ns; the run starts when it is created")
    ]
    source.read.clear()
    waiters.changed("ns", "writer")  # the Agent does not exist yet: it looks again, announces nothing new
    await asyncio.wait_for(source.read.wait(), 5)
    assert source.reads == 2
    source.agent = AGENT
    waiters.changed("ns", "writer")
    got = await asyncio.wait_for(task, 5)
    assert isinstance(got, AgentRunSpec) and got.system_prompt == "Write."
    assert len(recorder.announced) == 1 and len(recorder.recorded) == 1


async def test_cancel_while_waiting_for_the_agent_ends_the_run_cancelled() -> None:
    cancel = asyncio.Event()
    source, recorder = Source(), Recorder()
    task = asyncio.create_task(
        resolve_agent(
            RUN,
            NO_STATUS,
            namespace="ns",
            source=source,
            cancel=cancel,
            announce=recorder.announce,
            record=recorder.record,
            retry_seconds=3600,
        )
    )
    await asyncio.wait_for(recorder.pending.wait(), 5)
    cancel.set()
    got = await asyncio.wait_for(task, 5)
    assert isinstance(got, Ending) and got.outcome.stop_reason is StopReason.CANCELLED


async def test_a_run_loosening_its_agents_limit_ends_invalid_spec_naming_the_agent() -> None:
    source, recorder = Source(AGENT), Recorder()
    got = await resolve_agent(
        AgentRunSpec.model_validate({**RUN_SPEC, "limits": {"maxIterations": 500}}),
        NO_STATUS,
        namespace="ns",
        source=source,
        cancel=asyncio.Event(),
        announce=recorder.announce,
        record=recorder.record,
    )
    assert isinstance(got, Ending) and got.outcome.stop_reason is StopReason.INVALID_SPEC
    assert got.outcome.message.startswith("spec.limits.maxIterations 500 is above the Agent writer's 20")


async def test_a_run_from_an_agent_its_admission_refuses_ends_invalid_spec_naming_agent_and_generation() -> (
    None
):
    broken = {**AGENT, "spec": {**AGENT["spec"], "requiredTools": ["nope"]}}
    source, recorder = Source(broken), Recorder()
    got = await resolve_agent(
        RUN,
        NO_STATUS,
        namespace="ns",
        source=source,
        cancel=asyncio.Event(),
        announce=recorder.announce,
        record=recorder.record,
    )
    assert isinstance(got, Ending)
    assert got.outcome.stop_reason is StopReason.INVALID_SPEC
    assert got.outcome.message == (
        "Agent writer generation 3: spec.requiredTools: 'nope' is not one of the run's tools"
    )


async def test_a_resumed_run_names_the_generation_it_recorded_when_refused() -> None:
    status = AgentRunStatus.model_validate(
        {"agent": {"name": "writer", "uid": "u-1", "generation": 7}, "agentSpec": {"model": {"name": ""}}}
    )
    got = await resolve_agent(
        RUN,
        status,
        namespace="ns",
        source=Source(),
        cancel=asyncio.Event(),
        announce=Recorder().announce,
        record=Recorder().record,
    )
    assert isinstance(got, Ending)
    assert got.outcome.message.startswith("Agent writer generation 7: spec.model.name")
