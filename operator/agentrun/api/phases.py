"""The phases of an AgentRun, apart from the status models: readers that need only the names (the
kubectl plugin) do not pay for building the pydantic models (agentrun.api.status re-exports them)."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    AWAITING_APPROVAL = "AwaitingApproval"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


FINISHED_PHASES = frozenset(p.value for p in Phase if p.finished)
