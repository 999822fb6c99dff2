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

QUOTA_KIND = "AgentRunQuota"
QUOTA_PLURAL = "agentrunquotas"
QUOTA_SINGULAR = "agentrunquota"
QUOTA_SHORT_NAMES = ("arq",)

__all__ = [
    "API_VERSION",
    "CATEGORIES",
    "GROUP",
    "KIND",
    "PLURAL",
    "QUOTA_KIND",
    "QUOTA_PLURAL",
    "QUOTA_SHORT_NAMES",
    "QUOTA_SINGULAR",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "AgentRunSpec",
    "AgentRunStatus",
]
