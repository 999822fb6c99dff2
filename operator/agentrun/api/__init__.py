"""The AgentRun API: pydantic models of spec and status, the single source of the CRD schema.

This module holds only the names of the API (group, kinds, labels): the models live in
``agentrun.api.spec`` and ``agentrun.api.status``. Why not re-exported here: importing them builds
every pydantic model and JSON Schema validator (about 150 ms), which each `kubectl agentrun` call
paid for the constants it needs (docs/kubectl-plugin.md).
"""

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

AGENT_KIND = "Agent"
AGENT_PLURAL = "agents"
AGENT_SINGULAR = "agent"
AGENT_SHORT_NAMES = ("agt",)

SCHEDULE_KIND = "AgentSchedule"
SCHEDULE_PLURAL = "agentschedules"
SCHEDULE_SINGULAR = "agentschedule"
SCHEDULE_SHORT_NAMES = ("ags",)

TEMPLATE_KIND = "SandboxTemplate"
TEMPLATE_PLURAL = "sandboxtemplates"
TEMPLATE_SINGULAR = "sandboxtemplate"
TEMPLATE_SHORT_NAMES = ("sbt",)

#: The one command every message about a missing CRD advises: it installs (or upgrades) all of them.
INSTALL_CRDS = "agentrun crd --all | kubectl apply -f -"

# Labels and annotations the operator puts on the runs it creates.
LABEL_AGENT = "agentrun.dev/agent"
LABEL_PARENT = "agentrun.dev/parent"
LABEL_PARENT_UID = "agentrun.dev/parent-uid"
LABEL_TOOL_USE = "agentrun.dev/tool-use-id"
LABEL_DEPTH = "agentrun.dev/depth"
LABEL_SCHEDULE = "agentrun.dev/schedule"
ANNOTATION_SCHEDULED_TIME = "agentrun.dev/scheduled-time"

# What each operator replica publishes on its Lease (controller/replicas/leases.py): its group, and
# the namespaces it serves ("*": all; else its --namespace values, comma-separated), which
# `kubectl agentrun operators` reads to say whether a namespace is served.
LABEL_REPLICA_GROUP = "agentrun.dev/replica-group"
ANNOTATION_SERVES = "agentrun.dev/serves"

__all__ = [
    "AGENT_KIND",
    "AGENT_PLURAL",
    "AGENT_SHORT_NAMES",
    "AGENT_SINGULAR",
    "ANNOTATION_SCHEDULED_TIME",
    "ANNOTATION_SERVES",
    "API_VERSION",
    "CATEGORIES",
    "GROUP",
    "INSTALL_CRDS",
    "KIND",
    "LABEL_AGENT",
    "LABEL_DEPTH",
    "LABEL_PARENT",
    "LABEL_PARENT_UID",
    "LABEL_REPLICA_GROUP",
    "LABEL_SCHEDULE",
    "LABEL_TOOL_USE",
    "PLURAL",
    "QUOTA_KIND",
    "QUOTA_PLURAL",
    "QUOTA_SHORT_NAMES",
    "QUOTA_SINGULAR",
    "SCHEDULE_KIND",
    "SCHEDULE_PLURAL",
    "SCHEDULE_SHORT_NAMES",
    "SCHEDULE_SINGULAR",
    "SHORT_NAMES",
    "SINGULAR",
    "TEMPLATE_KIND",
    "TEMPLATE_PLURAL",
    "TEMPLATE_SHORT_NAMES",
    "TEMPLATE_SINGULAR",
    "VERSION",
]
