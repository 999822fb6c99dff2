"""A2A (the Agent2Agent protocol, version 1.0, JSON-RPC binding): Agents offered to other agents
(`agentrun a2a`, serving.py) and the wire format the A2A tool (tools/a2a_calling.py) shares with it."""
