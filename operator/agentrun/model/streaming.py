"""A streamed Messages API answer, folded from its raw events into the loop's ModelResponse.

Built to be cheap per event, which is why it replaces the SDK's ``messages.stream`` helper (measured in
`agentrun.model.anthropic_calling`): events stay the JSON dicts they were decoded into, string deltas are
collected per block and joined once, and tool input is parsed once, when the answer is complete. The
result is what the helper gave: tool input parsed as leniently as its accumulator does (a block cut by
``max_tokens`` keeps the properties complete before the cut), and null fields dropped as its
``model_dump(exclude_none=True)`` did, except inside tool input, which is the model's own data.
"""

from __future__ import annotations

from typing import Any

import jiter

from agentrun.api.usage import TokenUsage
from agentrun.loop.errors import FatalModelError, RetryableModelError, RetryClass
from agentrun.loop.protocols import AppliedContextEdits, Block, ModelResponse

TOOL_INPUT_BLOCKS = frozenset({"tool_use", "server_tool_use"})
#: Events whose data is malformed beyond what lenient reading can absorb.
MALFORMED = (KeyError, IndexError, TypeError, AttributeError, ValueError)


class StreamedMessage:
    """One answer while its events arrive. Only a stream that got from ``message_start`` to
    ``message_stop`` is an answer: anything shorter was cut off, and its partial content is never used."""

    def __init__(self, request_id: str | None) -> None:
        self.request_id = request_id
        self._message: dict[str, Any] = {}
        self._blocks: list[Block] = []
        self._usage: dict[str, Any] = {}
        self._pieces: dict[tuple[int, str], list[str]] = {}
        self._started = self._stopped = False

    def add(self, event: object) -> None:
        """Events that are not objects, and event types this client does not know, change nothing."""
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        try:
            if kind == "content_block_delta":
                self._block_delta(event["index"], event["delta"])
            elif kind == "content_block_start":
                self._blocks.append(event["content_block"])
            elif kind == "message_start":
                self._start(event["message"])
            elif kind == "message_delta":
                self._message_delta(event["delta"], event.get("usage"))
                if isinstance(event.get("context_management"), dict):
                    self._message["context_management"] = event["context_management"]
            elif kind == "message_stop":
                self._stopped = True
        except MALFORMED as exc:
            raise self._malformed(f"a malformed {kind} event") from exc

    def response(self) -> ModelResponse:
        if not (self._started and self._stopped):
            missing = "message_stop" if self._started else "message_start"
            raise RetryableModelError(
                f"the Messages API stream ended before {missing} (the answer was cut off)",
                retry_class=RetryClass.CONNECTION,
                request_id=self.request_id,
            )
        try:
            content = self._content()
        except MALFORMED as exc:
            raise self._malformed(f"content that cannot be read ({type(exc).__name__})") from exc
        message = self._message
        details = message.get("stop_details")
        return ModelResponse(
            content=content,
            stop_reason=_text(message.get("stop_reason")),
            stop_sequence=_text(message.get("stop_sequence")),
            usage=token_usage(self._usage),
            model=str(message.get("model") or ""),
            request_id=self.request_id,
            stop_details=details if isinstance(details, dict) else None,
            context_edits=applied_edits(content, message.get("context_management"), self._usage),
        )

    def _start(self, message: dict[str, Any]) -> None:
        self._message = {**message}
        self._blocks = list(message.get("content") or ())
        self._usage = {**(message.get("usage") or {})}
        self._started = True

    def _block_delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks[index]
        kind, block_type = delta["type"], block.get("type")
        if kind == "text_delta":
            if block_type == "text":
                self._piece(index, "text", delta["text"])
        elif kind == "input_json_delta":
            if block_type in TOOL_INPUT_BLOCKS:
                self._piece(index, "input", delta["partial_json"])
        elif kind == "thinking_delta":
            if block_type == "thinking":
                self._piece(index, "thinking", delta["thinking"])
        elif kind == "signature_delta":
            if block_type == "thinking":
                block["signature"] = delta["signature"]
        elif kind == "compaction_delta":
            # Sets the block's fields (the SDK's accumulator does the same); kept and sent back whole.
            if block_type == "compaction":
                block["content"] = delta.get("content")
                block["encrypted_content"] = delta.get("encrypted_content")
        elif kind == "citations_delta" and block_type == "text":
            citations = block.get("citations")
            if citations:
                citations.append(delta["citation"])
            else:
                block["citations"] = [delta["citation"]]

    def _piece(self, index: int, field: str, piece: str) -> None:
        pieces = self._pieces.get((index, field))
        if pieces is None:
            start = self._blocks[index].get(field) if field != "input" else None
            pieces = self._pieces[index, field] = [start if isinstance(start, str) else ""]
        pieces.append(piece)

    def _message_delta(self, delta: dict[str, Any], usage: object) -> None:
        """Usage counts here are cumulative and overwrite those of message_start; a count left out or
        null keeps the message_start value."""
        message = self._message
        message["stop_reason"] = delta.get("stop_reason")
        message["stop_sequence"] = delta.get("stop_sequence")
        message["stop_details"] = delta.get("stop_details")
        if isinstance(usage, dict):
            self._usage.update((name, value) for name, value in usage.items() if value is not None)

    def _content(self) -> list[Block]:
        for (index, field), pieces in self._pieces.items():
            block = self._blocks[index]
            joined = "".join(pieces)
            if field != "input":
                block[field] = joined
            elif joined:
                block["input"] = jiter.from_json(joined.encode(), partial_mode=True)
        return [finished_block(block) for block in self._blocks]

    def _malformed(self, what: str) -> FatalModelError:
        return FatalModelError(
            f"unexpected response from the Messages API: {what}",
            reason="ModelError",
            request_id=self.request_id,
        )


def finished_block(block: Block) -> Block:
    """The block as the SDK's typed model dumps it without nulls; tool input kept as the model wrote it."""
    finished = {
        key: value if key == "input" else _without_nulls(value)
        for key, value in block.items()
        if value is not None
    }
    if finished.get("type") in TOOL_INPUT_BLOCKS:
        finished.setdefault("input", {})
    return finished


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def token_usage(usage: object) -> TokenUsage:
    """A count that is missing, null or not a non-negative integer reads as 0: usage is read as leniently
    as the SDK reads it, so an odd server does not end a run over bookkeeping. A compaction on the
    server is billed but reported only in ``usage.iterations``, so it is added: budgets count it."""
    return _counts(usage) + (compaction_usage(usage) or TokenUsage())


def _counts(usage: object) -> TokenUsage:
    def tokens(name: str) -> int:
        value = usage.get(name) if isinstance(usage, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    return TokenUsage(
        input_tokens=tokens("input_tokens"),
        output_tokens=tokens("output_tokens"),
        cache_creation_input_tokens=tokens("cache_creation_input_tokens"),
        cache_read_input_tokens=tokens("cache_read_input_tokens"),
    )


def compaction_usage(usage: object) -> TokenUsage | None:
    """The ``compaction`` entries of ``usage.iterations``, which the top-level counts leave out."""
    iterations = usage.get("iterations") if isinstance(usage, dict) else None
    if not isinstance(iterations, list):
        return None
    entries = [e for e in iterations if isinstance(e, dict) and e.get("type") == "compaction"]
    if not entries:
        return None
    total = TokenUsage()
    for entry in entries:
        total += _counts(entry)
    return total


def applied_edits(content: list[Block], management: object, usage: object) -> AppliedContextEdits | None:
    """What the server's context management did, from the answer alone; None when it did nothing."""
    compacted = any(block.get("type") == "compaction" for block in content)
    applied = management.get("applied_edits") if isinstance(management, dict) else None
    cleared = [
        e for e in applied or () if isinstance(e, dict) and e.get("type") == "clear_tool_uses_20250919"
    ]
    spent = compaction_usage(usage)
    if not (compacted or cleared or spent):
        return None

    def total(name: str) -> int:
        return sum(e[name] for e in cleared if isinstance(e.get(name), int) and e[name] >= 0)

    return AppliedContextEdits(
        compacted=compacted,
        cleared_tool_uses=total("cleared_tool_uses"),
        cleared_input_tokens=total("cleared_input_tokens"),
        compaction_usage=spent,
    )
