"""Extra request headers kept in a Secret: the way webhook and MCP credentials reach a tool."""

from __future__ import annotations

import json

from agentrun.tools.environment import SecretMissing, SecretUse, ToolEnvironment
from agentrun.tools.errors import InvalidToolSpec

# Headers the operator sets itself; a Secret may not override them.
RESERVED = frozenset({"idempotency-key", "content-type", "content-length", "host"})


async def read_headers(env: ToolEnvironment, use: SecretUse | None) -> dict[str, str]:
    """The Secret's JSON object of headers; its contents never appear in an error message."""
    if use is None:
        return {}
    raw = await env.read_secret(use.ref.name, use.ref.key)
    if raw is None:
        raise SecretMissing(use, env.namespace)
    where = f"{use.field}: Secret {env.namespace}/{use.ref.name} key {use.ref.key!r}"
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidToolSpec(f"{where} is not JSON (expected an object of header names to values)") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidToolSpec(f"{where} must be a JSON object whose values are strings")
    reserved = sorted(k for k in value if k.lower() in RESERVED)
    if reserved:
        raise InvalidToolSpec(f"{where} sets headers the operator owns: {', '.join(reserved)}")
    bad = sorted(k for k, v in value.items() if not k or "\n" in k or "\n" in v or "\r" in v or "\r" in k)
    if bad:
        raise InvalidToolSpec(f"{where} has header names or values with line breaks")
    return dict(value)
