"""The AgentRun API: pydantic models of spec and status, the single source of the CRD schema."""

from agentrun.api.spec import AgentRunSpec
from agentrun.api.status import AgentRunStatus

GROUP = "agentrun.dev"
VERSION = "v1alpha1"
KIND = "AgentRun"
PLURAL = "agentruns"
SINGULAR = "agentrun"
SHORT_NAMES = ("ar",)
CATEGORIES = ("agents",)
API_VERSION = f"{GROUP}/{VERSION}"

__all__ = [
    "API_VERSION",
    "CATEGORIES",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "AgentRunSpec",
    "AgentRunStatus",
]
