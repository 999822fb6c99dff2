"""A scripted fake of the Anthropic Messages API, for the real SDK to talk to."""
