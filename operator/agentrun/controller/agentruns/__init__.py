"""The AgentRun kind: its reconciler, the phases of a run, and the I/O each phase needs."""
