"""The Anthropic adapter: the only package that imports the SDK."""
