"""The SandboxTemplates as the watch shows them: what an Agent's warm pool resolves its sandbox against.

Why a watched copy and not a read per pool: the pool is refilled every few seconds and on every Agent
event (pools.py), and its sandbox must be the one a run of the Agent resolves (the pool's key is made
of it), so it follows the template as it changes; a template event re-feeds the Agents that name it
(controller/kopf_registry.py). A run reads its template itself, once (agentruns/template_resolving.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from agentrun.api.sandbox_spec import SandboxDeclaration, SandboxSpec, SandboxTemplateSpec, resolve_sandbox
from agentrun.controller.agentruns.agent_resolving import AgentWaiters
from agentrun.kube.objects import ObjectMeta

__all__ = ["SandboxTemplates", "TemplateEvents"]


class SandboxTemplates:
    """Each namespace's SandboxTemplates by name, kept from their watch events."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str], Mapping[str, Any]] = {}

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = ObjectMeta.of(body)
        key = (meta.namespace, meta.name)
        if event_type == "DELETED" or meta.deletion_timestamp is not None:
            self._specs.pop(key, None)
        else:
            self._specs[key] = body.get("spec") or {}

    def resolved(self, namespace: str, declared: Mapping[str, Any] | None) -> SandboxSpec | None:
        """An Agent's spec.sandbox as its runs would resolve it now; None when it has none, names a
        template not seen (yet), or is invalid (the Agent's Ready condition, or its runs, say why)."""
        if not declared:
            return None
        try:
            sandbox = SandboxDeclaration.model_validate(declared)
            template: SandboxTemplateSpec | None = None
            if sandbox.template_ref is not None:
                found = self._specs.get((namespace, sandbox.template_ref.name))
                if found is None:
                    return None
                template = SandboxTemplateSpec.model_validate(found)
            return resolve_sandbox(sandbox, template)
        except ValidationError:
            return None

    @staticmethod
    def names(agent: Mapping[str, Any], namespace: str, name: str) -> bool:
        """Whether ``agent``'s sandbox names the template ``name`` of ``namespace``."""
        if ObjectMeta.of(agent).namespace != namespace:
            return False
        sandbox = (agent.get("spec") or {}).get("sandbox") or {}
        return bool((sandbox.get("templateRef") or {}).get("name") == name)


class SeenAgents(Protocol):
    """The Agents as their watch showed them (control.py AgentValidator), and how one is seen anew."""

    agents: dict[str, Mapping[str, Any]]

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None: ...


@dataclass
class TemplateEvents:
    """Where a SandboxTemplate's watch event goes (controller/kopf_registry.py): the copy warm pools
    resolve against, the runs waiting for the template, and the Agents that name it (seen anew, as
    from a listing, so that their pools follow the template). Without the SandboxTemplate CRD, Kopf
    logs once that it cannot watch them and serves the rest."""

    templates: SandboxTemplates = field(default_factory=SandboxTemplates)
    waiters: AgentWaiters | None = None
    agents: SeenAgents | None = None

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = ObjectMeta.of(body)
        self.templates.observe(event_type, body)
        if self.waiters is not None:
            self.waiters.changed(meta.namespace, meta.name)
        if self.agents is not None:
            seen = list(self.agents.agents.values())
            for agent in [a for a in seen if self.templates.names(a, meta.namespace, meta.name)]:
                await self.agents.observe(None, agent)
