"""Stand-ins for what cannot run on a development machine: a scripted fake of the Anthropic Messages API."""
