"""agentrun: a Kubernetes operator that runs LLM agent loops declared as AgentRun resources."""

__version__ = "0.1.0"
