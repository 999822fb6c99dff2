"""The `agentrun` command line."""
