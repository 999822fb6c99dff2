"""The demo brain: a deterministic stand-in model for requests no script claims.

It makes the offline demo and ad-hoc runs do something plausible with any tool set, in two phases:

1. Tools are offered, ``tool_choice`` is not ``none`` and the history holds no ``tool_result`` yet: it calls
   up to two of the offered tools (only the forced one for ``tool_choice: {type: tool}``, one when
   ``disable_parallel_tool_use`` is set) with inputs synthesised from each tool's ``input_schema``.
2. Otherwise it ends the turn with a short summary that quotes the tool results (truncated), or, with no
   tool results, acknowledges the task.

Usage is estimated like every unscripted number (see :func:`~agentrun_sandbox.messages.wire.estimate_tokens`):
input tokens from the size of system prompt, messages and tools; output tokens from the size of the reply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentrun_sandbox.messages.protocol import first_user_text, tool_results
from agentrun_sandbox.messages.script import Reply, text_block, tool_use_block

MAX_TOOLS_PER_TURN = 2
QUOTE_CHARS = 120

# Checked against a property name's words from the last one (the head noun: `pod_name` is a name).
_STRING_HINTS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"namespace", "ns"}), "default"),
    (frozenset({"url", "uri", "endpoint", "href", "link", "webhook"}), "https://example.com/"),
    (frozenset({"email", "mail"}), "user@example.com"),
    (frozenset({"path", "file", "filename", "dir", "directory", "folder"}), "/tmp/example.txt"),
    (frozenset({"command", "cmd", "script", "shell"}), "echo hello"),
    (frozenset({"query", "search", "question", "prompt", "q", "term"}), "current status"),
    (frozenset({"name", "title", "user", "username", "owner"}), "example"),
    (frozenset({"id", "uid", "key", "ref"}), "example-1"),
    (frozenset({"kind", "resource", "type", "category"}), "Pod"),
    (frozenset({"selector", "label", "labels", "tag"}), "app=example"),
    (frozenset({"method", "verb"}), "GET"),
    (frozenset({"language", "lang", "locale"}), "en"),
    (frozenset({"timestamp", "time", "since", "until", "date", "datetime"}), "2025-01-01T00:00:00Z"),
    (frozenset({"city", "location", "place", "region"}), "San Francisco, CA"),
    (frozenset({"host", "hostname", "domain"}), "example.com"),
    (frozenset({"version"}), "1.0.0"),
    (frozenset({"message", "text", "body", "content", "description", "comment"}), "hello"),
)
_FORMAT_EXAMPLES: Mapping[str, str] = {
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "email": "user@example.com",
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "00:00:00Z",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "hostname": "example.com",
    "ipv4": "127.0.0.1",
}
_NUMBER_HINTS: tuple[tuple[frozenset[str], int], ...] = (
    (frozenset({"port"}), 8080),
    (frozenset({"timeout", "seconds", "secs", "duration"}), 30),
    (frozenset({"limit", "count", "max", "size", "top", "results"}), 10),
)


def demo_reply(body: Mapping[str, Any]) -> Reply:
    """The brain's answer to a validated request."""
    tools = [tool for tool in body.get("tools") or [] if isinstance(tool.get("input_schema"), dict)]
    choice: Mapping[str, Any] = body.get("tool_choice") or {"type": "auto"}
    results = tool_results(body)
    if tools and choice.get("type") != "none" and not results:
        return _call_tools(tools, choice)
    return Reply([text_block(_summary(body, results))], stop_reason="end_turn")


def _call_tools(tools: list[Mapping[str, Any]], choice: Mapping[str, Any]) -> Reply:
    if choice.get("type") == "tool":
        chosen = [tool for tool in tools if tool["name"] == choice.get("name")]
    else:
        chosen = tools[: 1 if choice.get("disable_parallel_tool_use") else MAX_TOOLS_PER_TURN]
    blocks: list[dict[str, Any]] = []
    # A forced tool call starts with the tool_use itself, as the real model's does.
    if choice.get("type") in (None, "auto"):
        names = " and ".join(f"`{tool['name']}`" for tool in chosen)
        blocks.append(text_block(f"I'll use {names} to work on this."))
    for tool in chosen:
        blocks.append(tool_use_block(str(tool["name"]), example_for_schema(tool["input_schema"])))
    return Reply(blocks, stop_reason="tool_use")


def _summary(body: Mapping[str, Any], results: list[tuple[str, str, bool]]) -> str:
    if not results:
        task = " ".join(first_user_text(body).split())
        return f"Done. I looked at the task ({_truncate(task)}) and have nothing further to do."
    lines = [f"I ran {len(results)} tool call(s). Here is what they returned:"]
    for name, text, is_error in results:
        marker = " (error)" if is_error else ""
        lines.append(f"- {name}{marker}: {_truncate(' '.join(text.split()))!r}")
    lines.append("That completes the task.")
    return "\n".join(lines)


def _truncate(text: str) -> str:
    return text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 1] + "…"


def example_for_schema(schema: Mapping[str, Any], name: str = "", *, depth: int = 0) -> Any:
    """A plausible value for a JSON schema: required properties only, values chosen by type, format and the
    property's name (``namespace`` → ``default``, ``url`` → an https URL, ``port`` → 8080, …)."""
    for keyword in ("const", "default"):
        if keyword in schema:
            return schema[keyword]
    for keyword in ("enum", "examples"):
        if isinstance(schema.get(keyword), list) and schema[keyword]:
            return schema[keyword][0]
    for keyword in ("anyOf", "oneOf", "allOf"):
        options = schema.get(keyword)
        if isinstance(options, list) and options:
            usable = [o for o in options if isinstance(o, dict) and o.get("type") != "null"] or options
            return example_for_schema(usable[0], name, depth=depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    words = _words(name)
    if kind == "object":
        if depth > 6:
            return {}
        properties: Mapping[str, Any] = schema.get("properties") or {}
        return {
            key: example_for_schema(properties.get(key) or {}, key, depth=depth + 1)
            for key in schema.get("required") or []
        }
    if kind == "array":
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        count = max(1, int(schema.get("minItems", 1)))
        singular = name[:-1] if name.endswith("s") else name
        return [example_for_schema(items or {}, singular, depth=depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _number(schema, words, integer=kind == "integer")
    if kind == "boolean":
        return "dry" in words
    if kind == "null":
        return None
    return _string(schema, words)


def _string(schema: Mapping[str, Any], words: list[str]) -> str:
    value = _FORMAT_EXAMPLES.get(str(schema.get("format")))
    if value is None:
        value = next((text for word in reversed(words) for keys, text in _STRING_HINTS if word in keys), None)
    if value is None:
        value = f"example-{'-'.join(words)}" if words else "example"
    min_length, max_length = int(schema.get("minLength", 0)), schema.get("maxLength")
    value = value.ljust(min_length, "x")
    return value[: int(max_length)] if max_length is not None else value


def _number(schema: Mapping[str, Any], words: list[str], *, integer: bool) -> int | float:
    value: float = next((n for word in reversed(words) for keys, n in _NUMBER_HINTS if word in keys), 1)
    if "minimum" in schema:
        value = max(value, float(schema["minimum"]))
    if "exclusiveMinimum" in schema and value <= float(schema["exclusiveMinimum"]):
        value = float(schema["exclusiveMinimum"]) + 1
    if "maximum" in schema:
        value = min(value, float(schema["maximum"]))
    if "exclusiveMaximum" in schema and value >= float(schema["exclusiveMaximum"]):
        value = float(schema["exclusiveMaximum"]) - 1
    return int(value) if integer else float(value)


def _words(name: str) -> list[str]:
    """`podName`, `pod_name` and `pod-name` all read as ['pod', 'name']."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [word.lower() for word in re.split(r"[^A-Za-z0-9]+", spaced) if word]
