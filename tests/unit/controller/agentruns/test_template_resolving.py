"""The resolve_template phase: Pending until the SandboxTemplate exists, one record, a resumed run never
re-reads, and a template the run's sandbox cannot be made of ends the run naming the template and field."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrun.api.sandbox_spec import SandboxSpec
from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus, TemplateUsed
from agentrun.api.stops import StopReason
from agentrun.controller.agentruns.phases import Ending
from agentrun.controller.agentruns.template_resolving import (
    SANDBOX_TEMPLATE_NOT_FOUND,
    TemplateWaiters,
    resolve_template,
)

RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
RUN = AgentRunSpec.model_validate(
    {"task": "t", "sandbox": {"templateRef": {"name": "python"}, "commandTimeoutSeconds": 30}}
)
TEMPLATE = {
    "metadata": {"name": "python", "namespace": "ns", "uid": "t-1", "generation": 2},
    "spec": {"image": "python:3.12", "resources": RESOURCES, "commandTimeoutSeconds": 300},
}


class Source:
    def __init__(self, template: Mapping[str, Any] | None = None) -> None:
        self.template = template
        self.reads = 0
        self.read = asyncio.Event()

    async def get_sandbox_template(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        assert (namespace, name) == ("ns", "python")
        self.reads += 1
        self.read.set()
        return self.template


class Recorder:
    def __init__(self) -> None:
        self.announced: list[tuple[str, str]] = []
        self.recorded: list[tuple[TemplateUsed, Mapping[str, Any]]] = []
        self.pending = asyncio.Event()

    async def announce(self, reason: str, message: str) -> None:
        self.announced.append((reason, message))
        self.pending.set()

    async def record(self, template: TemplateUsed, spec: Mapping[str, Any]) -> None:
        self.recorded.append((template, spec))


async def _resolve(
    spec: AgentRunSpec,
    source: Source,
    recorder: Recorder,
    status: AgentRunStatus | None = None,
    cancel: asyncio.Event | None = None,
    waiters: TemplateWaiters | None = None,
    retry_seconds: float = 60,
) -> ResolvedRunSpec | Ending:
    return await resolve_template(
        spec,
        status or AgentRunStatus(),
        namespace="ns",
        source=source,
        cancel=cancel or asyncio.Event(),
        announce=recorder.announce,
        record=recorder.record,
        waiters=waiters,
        retry_seconds=retry_seconds,
    )


async def test_a_run_without_template_ref_reads_nothing_and_gets_its_own_sandbox() -> None:
    source, recorder = Source(), Recorder()
    own = AgentRunSpec.model_validate({"task": "t", "sandbox": {"image": "busybox", "resources": RESOURCES}})
    got = await _resolve(own, source, recorder)
    assert isinstance(got, ResolvedRunSpec) and isinstance(got.sandbox, SandboxSpec)
    assert got.sandbox.image == "busybox" and source.reads == 0
    plain = await _resolve(AgentRunSpec(task="t"), source, recorder)
    assert isinstance(plain, ResolvedRunSpec) and plain.sandbox is None and source.reads == 0


async def test_a_found_template_is_recorded_once_and_the_runs_fields_override_it() -> None:
    source, recorder = Source(TEMPLATE), Recorder()
    got = await _resolve(RUN, source, recorder)
    assert isinstance(got, ResolvedRunSpec) and got.sandbox is not None
    assert (got.sandbox.image, got.sandbox.command_timeout_seconds) == ("python:3.12", 30)
    assert recorder.recorded == [(TemplateUsed(name="python", uid="t-1", generation=2), TEMPLATE["spec"])]
    assert recorder.announced == []


async def test_a_resumed_run_uses_its_record_and_never_reads_the_template_again() -> None:
    source, recorder = Source(None), Recorder()  # deleted since the run read it
    status = AgentRunStatus(
        sandbox_template=TemplateUsed(name="python", uid="t-1", generation=2),
        sandbox_template_spec={**TEMPLATE["spec"], "image": "python:3.11"},
    )
    got = await _resolve(RUN, source, recorder, status)
    assert isinstance(got, ResolvedRunSpec) and got.sandbox is not None and got.sandbox.image == "python:3.11"
    assert source.reads == 0 and recorder.recorded == []


async def test_a_missing_template_keeps_the_run_pending_until_a_template_event_wakes_it() -> None:
    source, recorder, waiters = Source(None), Recorder(), TemplateWaiters()
    task = asyncio.create_task(_resolve(RUN, source, recorder, waiters=waiters))
    await asyncio.wait_for(recorder.pending.wait(), 5)
    assert recorder.announced == [
        (
            SANDBOX_TEMPLATE_NOT_FOUND,
            "SandboxTemplate python (spec.sandbox.templateRef) not found in namespace ns; "
            "the run starts when it is created",
        )
    ]
    source.template, source.read = TEMPLATE, asyncio.Event()
    waiters.changed("ns", "python")  # retry_seconds is a minute: only the event can wake it this soon
    got = await asyncio.wait_for(task, 5)
    assert isinstance(got, ResolvedRunSpec) and len(recorder.recorded) == 1 and source.reads == 2
    assert len(recorder.announced) == 1  # said once, not at every look


async def test_a_run_cancelled_while_waiting_for_its_template_ends_cancelled() -> None:
    source, recorder, cancel = Source(None), Recorder(), asyncio.Event()
    task = asyncio.create_task(_resolve(RUN, source, recorder, cancel=cancel))
    await asyncio.wait_for(recorder.pending.wait(), 5)
    cancel.set()
    got = await asyncio.wait_for(task, 5)
    assert isinstance(got, Ending) and got.outcome.stop_reason is StopReason.CANCELLED


async def test_a_template_the_model_refuses_ends_the_run_invalid_naming_template_generation_and_field() -> (
    None
):
    refused = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "workingDir": "relative"}}  # past a stand-in server
    got = await _resolve(RUN, Source(refused), Recorder())
    assert isinstance(got, Ending) and got.outcome.stop_reason is StopReason.INVALID_SPEC
    assert got.outcome.message.startswith("SandboxTemplate python generation 2: spec.workingDir: ")


async def test_a_template_that_with_the_runs_fields_is_refused_names_the_sandbox_field() -> None:
    # Each alone is valid (the API server keeps a nullable null), together the sandbox has no image.
    run = AgentRunSpec.model_validate(
        {"task": "t", "sandbox": {"templateRef": {"name": "python"}, "image": None}}
    )
    got = await _resolve(run, Source(TEMPLATE), Recorder())
    assert isinstance(got, Ending) and got.outcome.stop_reason is StopReason.INVALID_SPEC
    assert got.outcome.message.startswith(
        "SandboxTemplate python generation 2 with the run's spec.sandbox: spec.sandbox.image: "
    ), got.outcome.message
