"""Agents, purely: how a run's spec and its Agent's spec make the spec the run executes.

No I/O here: the controller fetches the Agent (controller/agentruns/agent_resolving.py) and
`agentrun run` reads it from the manifest; both hand the two specs to :func:`resolving.resolve`.
"""

from agentrun.agents.resolving import AGENT_OWNED_FIELDS, AgentSpecConflict, resolve

__all__ = ["AGENT_OWNED_FIELDS", "AgentSpecConflict", "resolve"]
