"""An AgentRun as one watch event showed it, parsed once into the models the CRD is generated from.

Why here, at the Kopf edge: everything after it (the run handler, the supervisor, the phases, the
Agent merge, quota admission, the loop's config, the status writer) reads typed fields, and which
fields the run's manifest declared is the model's ``model_fields_set`` instead of a second, raw copy
of the spec carried beside the typed one.

A spec the model refuses although the API server admitted it (what the CRD schema cannot say, such
as a JSON Schema that is no schema) is kept as :class:`InvalidRunSpec`: the run ends InvalidSpec
naming the fields, and only spec.ttlSecondsAfterFinished, which its deletion still honours, is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentrun.api.agent import AgentSpec
from agentrun.api.spec import AgentRunSpec, Approval
from agentrun.api.status import AgentRunStatus
from agentrun.controller.agentruns.phases import describe_validation_error
from agentrun.controller.snapshots import plain
from agentrun.kube.objects import ObjectMeta

__all__ = ["InvalidRunSpec", "RunObject"]


class _Lifetime(BaseModel):
    """The one field read of a spec the model refuses."""

    model_config = ConfigDict(extra="ignore")

    ttl_seconds_after_finished: int | None = Field(default=None, alias="ttlSecondsAfterFinished", ge=0)


@dataclass(frozen=True)
class InvalidRunSpec:
    """A spec the model refuses: ``problem`` names every field, as the InvalidSpec message says it.

    It answers what the handler asks of any run's spec (a run that ends at once has no approvals
    to wait for and no place in a queue), and keeps its ttlSecondsAfterFinished.
    """

    problem: str
    ttl_seconds_after_finished: int | None = None
    cancel: bool = False
    priority: int = 0
    approvals: tuple[Approval, ...] = ()
    model_fields_set: frozenset[str] = frozenset({"ttl_seconds_after_finished"})

    @classmethod
    def of(cls, exc: pydantic.ValidationError, raw: Mapping[str, Any]) -> InvalidRunSpec:
        try:
            ttl = _Lifetime.model_validate(raw)
        except pydantic.ValidationError:
            ttl = _Lifetime()  # the API server refuses a bad one: only a stand-in API server lets it by
        return cls(describe_validation_error(exc), ttl.ttl_seconds_after_finished)


@dataclass(frozen=True)
class RunObject:
    """The run's metadata, spec and status as models; ``agent`` is the Agent's spec it recorded
    (status.agentSpec, for a run with spec.agentRef), when that parses."""

    meta: ObjectMeta
    spec: AgentRunSpec | InvalidRunSpec
    status: AgentRunStatus = field(default_factory=AgentRunStatus)
    agent: AgentSpec | None = None

    @classmethod
    def parse(cls, body: Mapping[str, Any], earlier: RunObject | None = None) -> RunObject:
        """``body`` as a watch event or a listing shows it (Kopf's live view, or a plain dict).

        A plain dict is decoded JSON (the operator's own watch, a listing, a read) and plain all the
        way down: copying it first was 5% of the operator's CPU at 1000 runs, for a copy nobody else
        holds. Only Kopf's views are copied into a snapshot.

        ``earlier``, the same run from an earlier event, lends its spec when the generation says the
        spec has not changed since (the API server moves it on every spec change): most events are of
        the run's own status patches, and the spec's validation was 2% of the operator's CPU.
        """
        snapshot = _as_is if type(body) is dict else plain
        meta = ObjectMeta.of(body)
        spec: AgentRunSpec | InvalidRunSpec
        if (
            earlier is not None
            and meta.generation is not None
            and (earlier.meta.uid, earlier.meta.generation) == (meta.uid, meta.generation)
        ):
            spec = earlier.spec
        else:
            given = snapshot(body.get("spec") or {})
            try:
                spec = AgentRunSpec.model_validate(given)
            except pydantic.ValidationError as exc:
                spec = InvalidRunSpec.of(exc, given)
        status = AgentRunStatus.model_validate(snapshot(body.get("status") or {}))
        agent: AgentSpec | None = None
        if isinstance(spec, AgentRunSpec) and spec.agent_ref is not None and status.agent_spec is not None:
            try:
                agent = AgentSpec.model_validate(status.agent_spec)
            except pydantic.ValidationError:
                agent = None  # the run says why when it resolves its Agent (agent_resolving.py)
        return cls(meta, spec, status, agent)

    @property
    def namespace(self) -> str:
        return self.meta.namespace

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def uid(self) -> str:
        return self.meta.uid

    @property
    def generation(self) -> int | None:
        return self.meta.generation

    @property
    def created(self) -> str:
        """metadata.creationTimestamp: the queue's order within a namespace."""
        return self.meta.creation_timestamp

    @property
    def labels(self) -> Mapping[str, str]:
        return self.meta.labels

    @property
    def deleting(self) -> bool:
        return self.meta.deletion_timestamp is not None

    @property
    def finished(self) -> bool:
        return self.status.phase is not None and self.status.phase.finished

    @property
    def priority(self) -> int:
        """spec.priority as the run has it: its own, else its Agent's as recorded."""
        return int(self._declared("priority"))

    @property
    def ttl_seconds_after_finished(self) -> int | None:
        value = self._declared("ttl_seconds_after_finished")
        return value if isinstance(value, int) else None

    def _declared(self, name: str) -> Any:
        """A field of the run's own spec when it declares it, else of its recorded Agent's."""
        if name in self.spec.model_fields_set or self.agent is None:
            return getattr(self.spec, name)
        return getattr(self.agent, name)


def _as_is(value: Any) -> Any:
    return value
