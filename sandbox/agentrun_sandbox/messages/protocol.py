"""Request checks the real Messages API makes, so operator bugs fail loudly in tests instead of in production.

Only cheap, structural rules are enforced (roles, tool_use/tool_result pairing, tool names and tool_choice,
required fields); messages imitate the real API's wording so they are recognisable in logs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

from agentrun_sandbox.messages.script import TOOL_NAME_PATTERN


class ProtocolError(ValueError):
    """A request the real API would answer with 400 ``invalid_request_error``."""


INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"


#: The client tools the API defines, by type, with the one name each accepts.
TYPED_TOOL_NAMES = {
    "bash_20241022": "bash",
    "bash_20250124": "bash",
    "text_editor_20250124": "str_replace_editor",
    "text_editor_20250429": "str_replace_based_edit_tool",
    "text_editor_20250728": "str_replace_based_edit_tool",
}


def validate_request(
    body: object, *, count_tokens: bool = False, betas: Collection[str] = ()
) -> dict[str, Any]:
    """Returns the body as a dict, or raises :class:`ProtocolError` naming the first offending field.
    ``betas`` are the request's ``anthropic-beta`` values (interleaved thinking relaxes the budget)."""
    if not isinstance(body, dict):
        raise ProtocolError("request body must be a JSON object")
    request = cast(dict[str, Any], body)
    if not isinstance(request.get("model"), str) or not request["model"]:
        raise ProtocolError("model: Field required")
    if not count_tokens:
        max_tokens = request.get("max_tokens")
        if max_tokens is None:
            raise ProtocolError("max_tokens: Field required")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ProtocolError(f"max_tokens: must be a positive integer, got {max_tokens!r}")
    _check_system(request.get("system"))
    tool_names = _check_tools(request.get("tools"))
    _check_tool_choice(request.get("tool_choice"), tool_names)
    _check_messages(request.get("messages"))
    stop_sequences = request.get("stop_sequences")
    if stop_sequences is not None and (
        not isinstance(stop_sequences, list) or not all(isinstance(s, str) and s for s in stop_sequences)
    ):
        raise ProtocolError("stop_sequences: must be a list of non-empty strings")
    temperature = request.get("temperature")
    if temperature is not None and (not isinstance(temperature, int | float) or not 0 <= temperature <= 1):
        raise ProtocolError(f"temperature: must be between 0 and 1, got {temperature!r}")
    _check_thinking(request, count_tokens=count_tokens, interleaved=INTERLEAVED_THINKING_BETA in betas)
    _check_cache_marks(request)
    return request


#: The API refuses a request with more cache_control marks than this.
MAX_CACHE_BREAKPOINTS = 4


def _check_cache_marks(request: Mapping[str, Any]) -> None:
    blocks: list[object] = [*(request.get("tools") or [])]
    if isinstance(request.get("system"), list):
        blocks.extend(request["system"])
    for message in request.get("messages") or []:
        if isinstance(message.get("content"), list):
            blocks.extend(message["content"])
    found = sum(1 for block in blocks if isinstance(block, dict) and "cache_control" in block)
    if found > MAX_CACHE_BREAKPOINTS:
        raise ProtocolError(
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {found}."
        )
    for message in request.get("messages") or []:
        for block in message.get("content") if isinstance(message.get("content"), list) else []:
            if (
                isinstance(block, dict)
                and "cache_control" in block
                and block.get("type")
                in (
                    "thinking",
                    "redacted_thinking",
                )
            ):
                raise ProtocolError(f"cache_control cannot be set on a {block['type']} block")


def _check_thinking(request: Mapping[str, Any], *, count_tokens: bool, interleaved: bool) -> None:
    """Manual extended thinking and what the real API refuses next to it."""
    thinking = request.get("thinking")
    if thinking is None:
        return
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
        raise ProtocolError("thinking: must be an object whose type is enabled, disabled or adaptive")
    if thinking["type"] != "enabled":
        return
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise ProtocolError("thinking.enabled.budget_tokens: Field required")
    if budget < 1024:
        raise ProtocolError("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
    if not count_tokens and not interleaved and budget >= request["max_tokens"]:
        raise ProtocolError("`max_tokens` must be greater than `thinking.budget_tokens`")
    temperature = request.get("temperature")
    if temperature is not None and temperature != 1:
        raise ProtocolError("`temperature` may only be set to 1 when thinking is enabled")
    choice = request.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        raise ProtocolError("Thinking may not be enabled when tool_choice forces tool use.")


def _check_system(system: object) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise ProtocolError("system: must be a string or a list of text blocks")
    for index, block in enumerate(system):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise ProtocolError(f"system.{index}: must be a text block")


def _check_tools(tools: object) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise ProtocolError("tools: must be a list")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ProtocolError(f"tools.{index}: must be an object")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
            raise ProtocolError(
                f"tools.{index}.name: String should match pattern '{TOOL_NAME_PATTERN.pattern}'"
            )
        if name in names:
            raise ProtocolError(f"tools: Tool names must be unique, {name!r} appears twice")
        names.add(name)
        # Typed tools (e.g. "bash_20250124") are server-defined and carry no input_schema; the API
        # fixes their names.
        kind = tool.get("type")
        fixed = TYPED_TOOL_NAMES.get(str(kind))
        if fixed is not None and name != fixed:
            raise ProtocolError(f"tools.{index}.{kind}.name: Input should be '{fixed}'")
        if kind in (None, "custom"):
            schema = tool.get("input_schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                raise ProtocolError(f"tools.{index}.input_schema: must be a JSON schema with type 'object'")
    return names


def _check_tool_choice(choice: object, tool_names: set[str]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise ProtocolError("tool_choice: must be an object")
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise ProtocolError(f"tool_choice.type: must be one of auto, any, tool, none, got {kind!r}")
    if kind in ("any", "tool") and not tool_names:
        raise ProtocolError(f"tool_choice: type {kind!r} requires `tools` to be provided")
    if kind == "tool" and choice.get("name") not in tool_names:
        raise ProtocolError(f"tool_choice.name: tool {choice.get('name')!r} is not one of the provided tools")


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("messages: at least one message is required")
    previous_tool_ids: list[str] = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise ProtocolError(f"{where}: must be an object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise ProtocolError(f"{where}.role: must be 'user' or 'assistant', got {role!r}")
        if index == 0 and role != "user":
            raise ProtocolError("messages: the first message must use the 'user' role")
        if index > 0 and role == messages[index - 1].get("role"):
            raise ProtocolError(
                f'messages: roles must alternate between "user" and "assistant", '
                f'but found multiple "{role}" roles in a row at {where}'
            )
        is_final_assistant = index == len(messages) - 1 and role == "assistant"
        blocks = _blocks(message.get("content"), where, allow_empty=is_final_assistant)
        if role == "user":
            _check_tool_results(blocks, previous_tool_ids, index)
            previous_tool_ids = []
        else:
            previous_tool_ids = _check_assistant(blocks, where)
    if previous_tool_ids:
        raise ProtocolError(_unanswered(len(messages) - 1, previous_tool_ids))


def _blocks(content: object, where: str, *, allow_empty: bool) -> list[dict[str, Any]]:
    if isinstance(content, str):
        if not content and not allow_empty:
            raise ProtocolError(
                f"{where}: all messages must have non-empty content "
                "except for the optional final assistant message"
            )
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise ProtocolError(f"{where}.content: must be a string or a list of content blocks")
    if not content and not allow_empty:
        raise ProtocolError(
            f"{where}: all messages must have non-empty content except for the optional final assistant "
            "message"
        )
    for position, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ProtocolError(
                f"{where}.content.{position}: a content block must be an object with a `type`"
            )
        if block["type"] == "text" and (not isinstance(block.get("text"), str) or not block["text"]):
            raise ProtocolError(f"{where}.content.{position}: text content blocks must be non-empty")
    return cast(list[dict[str, Any]], content)


def _check_assistant(blocks: Sequence[Mapping[str, Any]], where: str) -> list[str]:
    ids: list[str] = []
    for position, block in enumerate(blocks):
        if block["type"] == "thinking" and not (
            isinstance(block.get("thinking"), str) and isinstance(block.get("signature"), str)
        ):
            raise ProtocolError(
                f"{where}.content.{position}: a thinking block needs `thinking` and `signature`"
            )
        if block["type"] == "redacted_thinking" and not isinstance(block.get("data"), str):
            raise ProtocolError(f"{where}.content.{position}.data: Field required")
        if block["type"] == "tool_result":
            raise ProtocolError(
                f"{where}.content.{position}: tool_result blocks are only allowed in user messages"
            )
        if block["type"] != "tool_use":
            continue
        tool_id, name = block.get("id"), block.get("name")
        if not isinstance(tool_id, str) or not tool_id:
            raise ProtocolError(f"{where}.content.{position}.id: Field required")
        if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
            raise ProtocolError(
                f"{where}.content.{position}.name: String should match pattern '{TOOL_NAME_PATTERN.pattern}'"
            )
        if not isinstance(block.get("input"), dict):
            raise ProtocolError(f"{where}.content.{position}.input: Input should be a valid dictionary")
        if tool_id in ids:
            raise ProtocolError(
                f"{where}.content.{position}: `tool_use` ids must be unique, {tool_id!r} repeats"
            )
        ids.append(tool_id)
    return ids


def _check_tool_results(blocks: Sequence[Mapping[str, Any]], expected: list[str], index: int) -> None:
    where = f"messages.{index}"
    answered: list[str] = []
    seen_other = False
    for position, block in enumerate(blocks):
        if block["type"] == "tool_use":
            raise ProtocolError(
                f"{where}.content.{position}: tool_use blocks are only allowed in assistant messages"
            )
        if block["type"] != "tool_result":
            seen_other = True
            continue
        tool_id = block.get("tool_use_id")
        if tool_id not in expected:
            raise ProtocolError(
                f"{where}.content.{position}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{tool_id}. Each `tool_result` block must have a corresponding `tool_use` block in the "
                "previous message."
            )
        if tool_id in answered:
            raise ProtocolError(
                f"{where}.content.{position}: each `tool_use` id must be answered by exactly one "
                f"`tool_result`; {tool_id} is answered twice"
            )
        if seen_other:
            raise ProtocolError(
                f"{where}.content.{position}: `tool_result` blocks must come first in the user message "
                "content, before any other block"
            )
        answered.append(str(tool_id))
    missing = [tool_id for tool_id in expected if tool_id not in answered]
    if missing:
        raise ProtocolError(_unanswered(index - 1, missing))


def _unanswered(index: int, ids: Sequence[str]) -> str:
    return (
        f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block in the next "
        "message."
    )


# ---------------------------------------------------------------------------------------------- reading


def text_of(content: object) -> str:
    """The plain text of a message's content, as used for script matching."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        str(block.get("text", ""))
        for block in content
        if isinstance(block, dict) and block.get("type") == "text"
    )


def first_user_text(body: Mapping[str, Any]) -> str:
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message.get("content"))
    return ""


def assistant_turns(body: Mapping[str, Any]) -> int:
    """The step index: how many times the model has already answered in this conversation."""
    return sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant")


def tool_results(body: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """Every tool result in the history as (tool name, text, is_error), names looked up from the tool_use."""
    names: dict[str, str] = {}
    results: list[tuple[str, str, bool]] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
            elif block.get("type") == "tool_result":
                name = names.get(str(block.get("tool_use_id")), "tool")
                inner = block.get("content", "")
                results.append((name, text_of(inner), bool(block.get("is_error", False))))
    return results
