"""Status writes as values of the status model: the one place where a status patch takes its shape.

Why typed: the CRD is generated from :class:`AgentRunStatus`, and the API server prunes status
fields the CRD does not declare, silently. A patch built from the same model cannot name a field
the CRD lacks, and a field renamed in the model is renamed in every write. The writer
(controller/agentruns/status_writing.py) only sends these; `agentrun run` prints them.

A JSON merge patch removes a field with an explicit null, so a patch carries the model's fields
it sets plus the names of the fields it clears.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, cast

import pydantic

from agentrun.api.conditions import RESULT_LIMIT, bounded_result, conditions_for
from agentrun.api.status import (
    AgentRunStatus,
    AgentUsed,
    AwaitingChild,
    ChildrenStatus,
    Condition,
    ContextStatus,
    PendingApproval,
    Phase,
    QuotaLimits,
    QuotaWait,
    TemplateUsed,
    TranscriptRef,
    Usage,
)
from agentrun.api.stops import Outcome
from agentrun.api.traces import Progress

PENDING_INPUT_LIMIT = 4096


@dataclass(frozen=True)
class StatusPatch:
    """A merge patch of ``status``: the fields set on ``status`` are written, ``cleared`` ones removed."""

    status: AgentRunStatus = field(default_factory=AgentRunStatus)
    cleared: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = self.cleared - AgentRunStatus.model_fields.keys()
        if unknown:
            raise ValueError(f"not fields of AgentRunStatus: {sorted(unknown)}")

    @property
    def fields(self) -> frozenset[str]:
        """The model fields this patch writes (set or cleared)."""
        return frozenset(self.status.model_fields_set) | self.cleared

    def merged(self, other: StatusPatch) -> StatusPatch:
        """This patch, then ``other`` on top: what ``other`` sets or clears wins.

        A copy of this status with ``other``'s fields set, when ``other`` clears none that this one
        sets (nearly every merge): ``model_construct`` walks every field of the model, about 6% of the
        operator's CPU at 1000 runs (bench/RESULTS.md), where a copy is one dict.
        """
        cleared = (self.cleared - other.status.model_fields_set) | other.cleared
        if not other.cleared & self.status.model_fields_set:
            update = {name: getattr(other.status, name) for name in other.status.model_fields_set}
            return StatusPatch(self.status.model_copy(update=update), cleared)
        values = {name: getattr(self.status, name) for name in self.status.model_fields_set - other.cleared}
        values.update({name: getattr(other.status, name) for name in other.status.model_fields_set})
        status = AgentRunStatus.model_construct(_fields_set=set(values), **_defaults(values), **values)
        return StatusPatch(status, cleared)

    def body(self) -> dict[str, Any]:
        """The JSON of the patch's ``status`` (camelCase, as stored)."""
        body = self.status.model_dump(mode="json", by_alias=True, exclude_unset=True)
        for name in self.cleared - self.status.model_fields_set:
            body[_alias(name)] = None
        return body


def _defaults(values: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults of the fields `values` leaves unset, handed to ``model_construct``.

    Left to pydantic, ``model_construct`` inspects the signature of every default factory on every
    call (to see whether it takes the validated data): about a tenth of the operator's CPU at 1000 runs
    (bench/RESULTS.md, operator at scale). No factory of the status model takes it, checked once here.
    """
    return {
        name: default if factory is None else factory()
        for name, (factory, default) in _FIELD_DEFAULTS.items()
        if name not in values
    }


def _field_default(info: pydantic.fields.FieldInfo) -> tuple[Callable[[], Any] | None, Any]:
    if info.default_factory is None:
        return None, info.default
    if info.default_factory_takes_validated_data:
        raise TypeError("a status default factory taking the validated data is not supported here")
    return cast("Callable[[], Any]", info.default_factory), None


#: Per field: its zero-argument default factory, or None and its default.
_FIELD_DEFAULTS = {name: _field_default(info) for name, info in AgentRunStatus.model_fields.items()}


def _alias(name: str) -> str:
    return AgentRunStatus.model_fields[name].alias or name


def usage(progress: Progress) -> Usage:
    u = progress.usage
    return Usage(
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        cache_creation_input_tokens=u.cache_creation_input_tokens,
        cache_read_input_tokens=u.cache_read_input_tokens,
        total_tokens=u.total,
        costUSD=None if progress.cost_usd is None else f"{progress.cost_usd:.6f}",
        unpriced_models=list(progress.unpriced_models),
    )


def progressed(progress: Progress) -> StatusPatch:
    """The counters: iterations, tool calls, tokens and spend."""
    return StatusPatch(
        AgentRunStatus(iterations=progress.iterations, tool_calls=progress.tool_calls, usage=usage(progress))
    )


def compacted(
    *, compactions: int, iteration: int, tokens_before: int, tokens_after: int, tokens_removed: int
) -> StatusPatch:
    """status.context after a compaction; the whole object, so a resumed run's write is complete."""
    return StatusPatch(
        AgentRunStatus(
            context=ContextStatus(
                compactions=compactions,
                last_compaction_iteration=iteration,
                tokens_before=tokens_before,
                tokens_after=tokens_after,
                tokens_removed=tokens_removed,
            )
        )
    )


def pending() -> StatusPatch:
    return StatusPatch(AgentRunStatus(phase=Phase.PENDING))


def queued(position: int) -> StatusPatch:
    """Pending for a run slot, at ``position`` in the operator's queue (1 = next)."""
    return StatusPatch(AgentRunStatus(phase=Phase.PENDING, queue_position=position))


def left_queue() -> StatusPatch:
    """status.queuePosition removed: the run got its slot, ended, or waits for something else."""
    return StatusPatch(cleared=frozenset({"queue_position"}))


def quota_waiting(wait: QuotaWait) -> StatusPatch:
    """Pending for quota: status.quotaWait says which quota and limit (or the line) hold the run."""
    return StatusPatch(AgentRunStatus(phase=Phase.PENDING, quota_wait=wait))


def left_quota_line() -> StatusPatch:
    """status.quotaWait removed: the run was admitted, ended, or waits for something else."""
    return StatusPatch(cleared=frozenset({"quota_wait"}))


def quota_limited(limits: QuotaLimits) -> StatusPatch:
    """status.quotaLimits: what the namespace's quotas set at admission, kept by a resumed run."""
    return StatusPatch(AgentRunStatus(phase=Phase.PENDING, quota_limits=limits))


def agent_resolved(agent: AgentUsed, agent_spec: Mapping[str, Any]) -> StatusPatch:
    """status.agent and status.agentSpec in one write: a resumed run needs both or neither."""
    return StatusPatch(AgentRunStatus(phase=Phase.PENDING, agent=agent, agent_spec=dict(agent_spec)))


def sandbox_template_resolved(template: TemplateUsed, template_spec: Mapping[str, Any]) -> StatusPatch:
    """status.sandboxTemplate and status.sandboxTemplateSpec in one write: a resumed run needs both."""
    return StatusPatch(
        AgentRunStatus(
            phase=Phase.PENDING, sandbox_template=template, sandbox_template_spec=dict(template_spec)
        )
    )


def children(bodies: Sequence[Mapping[str, Any]]) -> StatusPatch:
    """status.children from the child runs as they are now: the whole summary, so any one write is
    complete. Approvals awaited deeper down come up through each child's own summary."""
    # Every field set explicitly: a merge patch keeps what an earlier summary wrote to a field left out.
    summary = ChildrenStatus(
        total=len(bodies), active=0, succeeded=0, failed=0, tokens=0, costUSD=None, awaiting_approval=[]
    )
    cost: Decimal | None = Decimal(0)
    waiting: list[AwaitingChild] = []
    for body in sorted(bodies, key=lambda b: str((b.get("metadata") or {}).get("creationTimestamp") or "")):
        name = str((body.get("metadata") or {}).get("name") or "")
        status = body.get("status") or {}
        phase = status.get("phase")
        if phase == Phase.SUCCEEDED:
            summary.succeeded += 1
        elif phase in (Phase.FAILED, Phase.CANCELLED):
            summary.failed += 1
        else:
            summary.active += 1
        spent = status.get("usage") or {}
        tokens = int(spent.get("totalTokens") or 0)
        summary.tokens += tokens
        if spent.get("costUSD") is not None and cost is not None:
            cost += Decimal(str(spent["costUSD"]))
        elif tokens:
            cost = None
        for entry in status.get("pendingApprovals") or []:
            waiting.append(
                AwaitingChild(
                    run=name, tool_use_id=str(entry.get("toolUseId")), tool=str(entry.get("toolName"))
                )
            )
        for entry in (status.get("children") or {}).get("awaitingApproval") or []:
            waiting.append(AwaitingChild.model_validate(entry))
    summary.cost_usd = None if cost is None else f"{cost:.6f}"
    summary.awaiting_approval = waiting
    return StatusPatch(AgentRunStatus(children=summary))


def running(start_time: str, *, clear_pending_approvals: bool = False) -> StatusPatch:
    return StatusPatch(
        AgentRunStatus(phase=Phase.RUNNING, start_time=start_time),
        frozenset({"pending_approvals"}) if clear_pending_approvals else frozenset(),
    )


def approvals_settled() -> StatusPatch:
    """Back to Running once the last awaited call is decided."""
    return StatusPatch(AgentRunStatus(phase=Phase.RUNNING), frozenset({"pending_approvals"}))


def pending_input(value: Mapping[str, Any]) -> dict[str, Any]:
    """A call's input for status.pendingApprovals, cut when large: status must stay small."""
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= PENDING_INPUT_LIMIT:
        return dict(value)
    return {"_truncated": True, "_preview": text[:PENDING_INPUT_LIMIT]}


def pending_approval(
    tool_use_id: str, tool_name: str, call_input: Mapping[str, Any], since: str
) -> PendingApproval:
    return PendingApproval(
        tool_use_id=tool_use_id, tool_name=tool_name, input=pending_input(call_input), since=since
    )


def awaiting_approval(waiting: Sequence[PendingApproval]) -> StatusPatch:
    return StatusPatch(AgentRunStatus(phase=Phase.AWAITING_APPROVAL, pending_approvals=list(waiting)))


def transcript(reference: TranscriptRef) -> StatusPatch:
    return StatusPatch(AgentRunStatus(transcript=reference))


def conditioned(
    phase: Phase,
    *,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]] = (),
) -> StatusPatch:
    """message, observedGeneration and the conditions of ``phase``; every write carries them."""
    conditions = conditions_for(
        phase, reason=reason, message=message, now=now, generation=generation, previous=previous
    )
    return StatusPatch(
        AgentRunStatus(
            message=message,
            observed_generation=generation,
            conditions=[Condition.model_validate(c) for c in conditions],
        )
    )


def finished(
    outcome: Outcome,
    progress: Progress,
    *,
    now: str,
    generation: int | None,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
) -> StatusPatch:
    """The whole terminal status of an outcome; shared by the operator and `agentrun run`."""
    reason = outcome.stop_reason
    if reason.succeeded:
        phase = Phase.SUCCEEDED
    elif reason.value == "Cancelled":
        phase = Phase.CANCELLED
    else:
        phase = Phase.FAILED
    result, truncated = bounded_result(outcome.result)
    output, omitted = bounded_output(outcome.output)
    end = StatusPatch(
        AgentRunStatus(
            phase=phase,
            stop_reason=reason.value,
            raw_stop_reason=outcome.raw_stop_reason,
            result=result,
            result_truncated=truncated or None,
            completion_time=now,
        )
    )
    if output is not None:
        end = end.merged(StatusPatch(AgentRunStatus(output=output)))
    elif omitted:
        end = end.merged(StatusPatch(AgentRunStatus(output_omitted=True)))
    return end.merged(progressed(progress)).merged(
        conditioned(
            phase,
            reason=outcome.condition_reason or reason.value,
            message=outcome.message,
            now=now,
            generation=generation,
            previous=previous_conditions,
        )
    )


def bounded_output(value: Any) -> tuple[Any, bool]:
    """JSON cannot be cut and stay JSON: a structured answer too big for status is left out whole."""
    if value is None:
        return None, False
    if len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()) <= RESULT_LIMIT:
        return value, False
    return None, True


def observed(status: AgentRunStatus, generation: int | None) -> StatusPatch | None:
    """Marks a finished run's latest generation observed, or None when it already is.

    A finished run's spec can still change (cancel, approvals, ttlSecondsAfterFinished); without
    this, kstatus (Flux) reads `observedGeneration != generation` as "in progress" forever.
    """
    if generation is None or status.observed_generation in (None, generation):
        return None
    conditions = [c.model_copy(update={"observed_generation": generation}) for c in status.conditions]
    return StatusPatch(AgentRunStatus(observed_generation=generation, conditions=conditions))
