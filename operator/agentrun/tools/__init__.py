"""Tools an AgentRun may declare: built-ins, HTTP webhooks and MCP servers."""
