"""The resolve_template phase: a run's sandbox gets its SandboxTemplate, once, before admission.

Why before admission: quota admission counts the sandbox's CPU and memory, which may come from the
template. The template's spec is recorded in the run's status (status.sandboxTemplateSpec) together
with its identity (status.sandboxTemplate) in one write, and a resumed run uses that record: a
template edited or deleted later never changes a run that already started from it (as an Agent's
record does, agent_resolving.py). Until the template exists the run is Pending (reason
SandboxTemplateNotFound); it looks again when a SandboxTemplate event arrives and every
``retry_seconds`` in case an event was missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import pydantic

from agentrun.api import status_patches
from agentrun.api.sandbox_spec import SandboxSpec, SandboxTemplateSpec, resolve_sandbox
from agentrun.api.spec import AgentRunSpec, ResolvedRunSpec
from agentrun.api.status import AgentRunStatus, Phase, TemplateUsed
from agentrun.api.stops import StopReason
from agentrun.api.traces import Progress
from agentrun.controller.agentruns.agent_resolving import AgentWaiters, wait_until_found
from agentrun.controller.agentruns.phases import Ending, describe_validation_error
from agentrun.controller.agentruns.resuming import NO_PROGRESS
from agentrun.controller.agentruns.status_writing import StatusWriter
from agentrun.kube.objects import ObjectMeta

__all__ = [
    "SANDBOX_TEMPLATE_NOT_FOUND",
    "TemplateSource",
    "TemplateWaiters",
    "resolve_template",
    "template_not_found",
    "template_recorder",
]

SANDBOX_TEMPLATE_NOT_FOUND = "SandboxTemplateNotFound"

#: Runs waiting for a SandboxTemplate to exist, woken by the SandboxTemplate watch: the same
#: (namespace, name) registry as the Agent waiters'.
TemplateWaiters = AgentWaiters


class TemplateSource(Protocol):
    """Where SandboxTemplates are read from: the API server (kube/calling.py)."""

    async def get_sandbox_template(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...


def template_not_found(name: str, namespace: str) -> str:
    return (
        f"SandboxTemplate {name} (spec.sandbox.templateRef) not found in namespace {namespace}; "
        "the run starts when it is created"
    )


def template_recorder(writer: StatusWriter) -> Callable[[TemplateUsed, Mapping[str, Any]], Awaitable[None]]:
    """What records a run's template: status.sandboxTemplate and status.sandboxTemplateSpec, one write."""

    async def record(template: TemplateUsed, template_spec: Mapping[str, Any]) -> None:
        await writer.write(
            status_patches.sandbox_template_resolved(template, template_spec),
            Phase.PENDING,
            "SandboxTemplateResolved",
            f"the run's sandbox comes from SandboxTemplate {template.name} generation {template.generation}",
        )

    return record


async def resolve_template(
    spec: AgentRunSpec,
    status: AgentRunStatus,
    *,
    namespace: str,
    source: TemplateSource,
    cancel: asyncio.Event,
    announce: Callable[[str, str], Awaitable[None]],
    record: Callable[[TemplateUsed, Mapping[str, Any]], Awaitable[None]],
    waiters: TemplateWaiters | None = None,
    retry_seconds: float = 5.0,
    progress: Progress = NO_PROGRESS,
) -> ResolvedRunSpec | Ending:
    """The spec the run executes with its sandbox complete: the template's fields under the run's.

    A sandbox the template and the run's fields together make invalid ends the run InvalidSpec,
    naming the template, its generation and the field; a cancel while waiting for the template ends
    it Cancelled. Without templateRef nothing is read (the declaration is complete: the CRD and the
    model require image and resources then).
    """
    declared = spec.sandbox
    if declared is None or declared.template_ref is None:
        try:
            return ResolvedRunSpec.of(spec, None if declared is None else resolve_sandbox(declared, None))
        except pydantic.ValidationError as exc:  # only a stand-in API server lets such a spec by
            return Ending.of(StopReason.INVALID_SPEC, describe_validation_error(exc, "spec.sandbox"))
    name = declared.template_ref.name
    if status.sandbox_template_spec is not None:
        template_spec: Mapping[str, Any] = status.sandbox_template_spec
        generation = status.sandbox_template.generation if status.sandbox_template is not None else None
    else:
        found = await wait_until_found(
            lambda: source.get_sandbox_template(namespace, name),
            (namespace, name),
            cancel=cancel,
            announce=lambda: announce(SANDBOX_TEMPLATE_NOT_FOUND, template_not_found(name, namespace)),
            waiters=waiters,
            retry_seconds=retry_seconds,
        )
        if found is None:
            cancelled = "spec.cancel was set while waiting for the SandboxTemplate"
            return Ending.of(StopReason.CANCELLED, cancelled, progress=progress)
        meta = ObjectMeta.of(found)
        template_spec, generation = found.get("spec") or {}, meta.generation
        await record(TemplateUsed(name=name, uid=meta.uid, generation=generation), template_spec)
    where = f"SandboxTemplate {name} generation {generation}"
    try:
        template = SandboxTemplateSpec.model_validate(template_spec)
    except pydantic.ValidationError as exc:  # refused by the CRD; a stand-in server, or an older CRD
        problem = f"{where}: {describe_validation_error(exc)}"
        return Ending.of(StopReason.INVALID_SPEC, problem, progress=progress)
    try:
        sandbox: SandboxSpec = resolve_sandbox(declared, template)
    except pydantic.ValidationError as exc:
        problem = describe_validation_error(exc, "spec.sandbox")
        return Ending.of(
            StopReason.INVALID_SPEC, f"{where} with the run's spec.sandbox: {problem}", progress=progress
        )
    return ResolvedRunSpec.of(spec, sandbox)
