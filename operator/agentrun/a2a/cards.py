"""An exposed Agent's Agent Card (A2A 1.0's JSON mapping): who it is, where tasks go, how to sign in.

Pure: serving.py passes the Agent as read and the base URL it is reached at. Only what spec.a2a says is
published, never the system prompt or the tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun import __version__
from agentrun.a2a import protocol
from agentrun.api.a2a_spec import A2AExposure

SCHEME = "kubernetes"
#: What a caller presents: a token the cluster's API server accepts; the task runs as that identity.
SCHEME_DESCRIPTION = (
    "A Kubernetes bearer token (kubectl create token, or your identity provider's). It is reviewed by the "
    "API server, and each task is created as that identity: RBAC on agentruns applies."
)


def exposure(agent: Mapping[str, Any]) -> A2AExposure | None:
    """spec.a2a when the Agent is exposed, else None (not exposed, or never set)."""
    raw = (agent.get("spec") or {}).get("a2a")
    if not isinstance(raw, Mapping):
        return None
    parsed = A2AExposure.model_validate(raw)
    return parsed if parsed.expose else None


def card(agent: Mapping[str, Any], exposed: A2AExposure, base_url: str) -> dict[str, Any]:
    metadata = agent.get("metadata") or {}
    name, namespace = str(metadata.get("name")), str(metadata.get("namespace"))
    skills = [
        {
            "id": skill.id,
            "name": skill.name,
            "description": skill.description,
            "tags": list(skill.tags),
            "examples": list(skill.examples),
        }
        for skill in exposed.skills
    ] or [
        {
            "id": name,
            "name": name,
            "description": exposed.description or f"Runs the Agent {namespace}/{name} on the task sent.",
            "tags": ["agentrun"],
        }
    ]
    return {
        "name": name,
        "description": exposed.description or f"The Agent {name} of namespace {namespace}, run by agentrun.",
        "supportedInterfaces": [
            {
                "url": base_url,
                "protocolBinding": protocol.BINDING,
                "protocolVersion": protocol.PROTOCOL_VERSION,
            }
        ],
        "provider": {
            "organization": "agentrun-operator",
            "url": "https://github.com/agentrun-dev/agentrun-operator",
        },
        "version": f"{__version__}+generation.{metadata.get('generation', 0)}",
        "capabilities": {"streaming": True, "pushNotifications": False},
        "securitySchemes": {
            SCHEME: {"httpAuthSecurityScheme": {"scheme": "Bearer", "description": SCHEME_DESCRIPTION}}
        },
        "securityRequirements": [{"schemes": {SCHEME: {"list": []}}}],
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    }
