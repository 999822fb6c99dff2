"""Agents as the operator sees them: each one validated when it is created or changed, its verdict in status.

A broken Agent (a tool configuration the operator refuses, a cross-field rule the CRD cannot express)
would otherwise surface only when a run of it ends InvalidSpec; status.conditions Ready says so at once.
"""

from agentrun.controller.agents.control import AgentValidator
from agentrun.controller.agents.validating import agent_status, check

__all__ = ["AgentValidator", "agent_status", "check"]
