"""The one place where run states become Kubernetes status: a pure function of its inputs.

Conditions follow the API conventions plus the kstatus trio, so Flux and Argo CD read health:
running → Reconciling=True; succeeded → Ready=True; failed or cancelled → Stalled=True.

A run waiting for a human approval is still progressing, not stalled: Reconciling=True with
reason AwaitingApproval. Stalled=True would make Flux give up on a run that is only waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.api.status import Phase

RESULT_LIMIT = 32 * 1024
AWAITING_APPROVAL = "AwaitingApproval"
#: Ready=False of an Agent or AgentSchedule whose spec the operator refuses (a run's stop reason too).
INVALID_SPEC = "InvalidSpec"


def _condition(
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
    previous: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    old = previous.get(type_)
    # lastTransitionTime moves only when the status value itself changes.
    since = (old.get("lastTransitionTime") or now) if old and old.get("status") == status else now
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def condition(
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    now: str,
    previous: Sequence[Mapping[str, Any]] = (),
    generation: int | None = None,
) -> dict[str, Any]:
    """One condition kept by a run's rule: for the other kinds' own Ready (Agent, AgentSchedule)."""
    prev = {str(c.get("type")): c for c in previous if isinstance(c, Mapping)}
    return _condition(type_, status, reason, message, now, generation, prev)


def conditions_for(
    phase: Phase,
    *,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Succeeded + Ready/Reconciling/Stalled for a phase; `reason` is CamelCase."""
    prev = {str(c.get("type")): c for c in previous if isinstance(c, Mapping)}

    def cond(t: str, s: str, r: str, m: str) -> dict[str, Any]:
        return _condition(t, s, r, m, now, generation, prev)

    if phase is Phase.SUCCEEDED:
        return [
            cond("Succeeded", "True", reason, message),
            cond("Ready", "True", reason, message),
            cond("Reconciling", "False", reason, "the run has finished"),
            cond("Stalled", "False", reason, "the run has finished"),
        ]
    if phase in (Phase.FAILED, Phase.CANCELLED):
        return [
            cond("Succeeded", "False", reason, message),
            cond("Ready", "False", reason, message),
            cond("Reconciling", "False", reason, "the run has finished"),
            cond("Stalled", "True", reason, message),
        ]
    # Pending, Running, AwaitingApproval: in progress.
    if phase is Phase.AWAITING_APPROVAL:
        reason = AWAITING_APPROVAL
    return [
        cond("Succeeded", "Unknown", reason, message),
        cond("Ready", "False", reason, message),
        cond("Reconciling", "True", reason, message),
        cond("Stalled", "False", reason, message),
    ]


def observed_generation_patch(status: Mapping[str, Any], generation: int | None) -> dict[str, Any] | None:
    """The status patch that marks a finished run's latest generation observed, or None if it is.

    A finished run's spec can still change (cancel, approvals, ttlSecondsAfterFinished); without
    this, kstatus (Flux) reads `observedGeneration != generation` as "in progress" forever.
    """
    if generation is None or status.get("observedGeneration") in (None, generation):
        return None
    conditions = [
        {**c, "observedGeneration": generation} if isinstance(c, Mapping) else c
        for c in status.get("conditions") or ()
    ]
    return {"observedGeneration": generation, "conditions": conditions}


def bounded_result(text: str | None) -> tuple[str | None, bool]:
    """Status must stay small (etcd object limit, watch traffic); the transcript has the rest."""
    if text is None:
        return None, False
    encoded = text.encode()
    if len(encoded) <= RESULT_LIMIT:
        return text, False
    return encoded[:RESULT_LIMIT].decode(errors="ignore"), True
