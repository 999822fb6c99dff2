"""The Messages API wire format: Message JSON, SSE events, error bodies, ids and token estimates.

Shapes follow what the ``anthropic`` SDK parses (``types/message.py``, ``types/raw_*_event.py``) and what
its stream accumulator expects: a ``message_start`` carrying the input-side usage, per block a
``content_block_start`` / deltas / ``content_block_stop``, then ``message_delta`` with the stop reason and
the cumulative usage, then ``message_stop``. Tool input is streamed as ``input_json_delta`` chunks that
start with an empty ``partial_json`` like the real API's.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import string
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

#: Characters per token used for every estimate: crude, deterministic, and close to English text.
CHARS_PER_TOKEN = 4
TEXT_CHUNK_CHARS = 24
JSON_CHUNK_CHARS = 16

_ALPHABET = string.digits + string.ascii_uppercase + string.ascii_lowercase

Event: TypeAlias = tuple[str, dict[str, Any]]


def new_request_id() -> str:
    """Random, because the real API gives every attempt (including retries) its own request id."""
    return "req_011C" + "".join(secrets.choice(_ALPHABET) for _ in range(20))


def derived_id(prefix: str, *parts: object) -> str:
    """Ids derived from the conversation and step keep a resent history answered with the same ids."""
    digest = int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest(), "big")
    chars = []
    for _ in range(22):
        digest, rest = divmod(digest, len(_ALPHABET))
        chars.append(_ALPHABET[rest])
    return f"{prefix}_01{''.join(chars)}"


def thinking_signature(thinking: str) -> str:
    """What the server signs a thinking block with: derived from the text, so a block whose text was
    altered no longer matches the signature it came with."""
    return "sig_" + hashlib.sha256(b"agentrun-fake-thinking\x1f" + thinking.encode()).hexdigest()


def estimate_tokens(value: object) -> int:
    """One token per :data:`CHARS_PER_TOKEN` characters of compact JSON (strings count as their text), at
    least 1, so usage grows with request and reply sizes in a documented, reproducible way."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def estimate_input_tokens(body: Mapping[str, Any]) -> int:
    """Counts what the model reads: system prompt, messages and tool definitions."""
    return estimate_tokens({key: body[key] for key in ("system", "messages", "tools") if key in body})


def error_body(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}


@dataclass(frozen=True)
class WireReply:
    """A reply with every id and number resolved: the single source both response modes are built from."""

    message_id: str
    model: str
    content: Sequence[Mapping[str, Any]]
    stop_reason: str
    stop_sequence: str | None
    stop_details: Mapping[str, Any] | None
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    iterations: Sequence[Mapping[str, Any]] | None = None
    """``usage.iterations`` (server-side compaction reports its own tokens only there)."""
    context_management: Mapping[str, Any] | None = None
    """``context_management`` of the answer: the edits the server applied."""

    def usage(self) -> dict[str, Any]:
        extra = {"iterations": [dict(i) for i in self.iterations]} if self.iterations is not None else {}
        return {
            **extra,
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_creation_input_tokens,
                "ephemeral_1h_input_tokens": 0,
            },
            "output_tokens": self.output_tokens,
            "service_tier": "standard",
        }

    def message(self) -> dict[str, Any]:
        """The non-streaming body (``types/message.py``)."""
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [dict(block) for block in self.content],
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "stop_details": dict(self.stop_details) if self.stop_details is not None else None,
            "usage": self.usage(),
            **({"context_management": dict(self.context_management)} if self.context_management else {}),
        }


@dataclass(frozen=True)
class Cut:
    """Where a truncated reply stops: its last block keeps ``keep`` of its text or tool-input JSON."""

    keep: float
    finish: bool
    """True: a ``max_tokens`` ending (block closed, message_delta, message_stop); False: stop mid-block."""


def stream_events(reply: WireReply, cut: Cut | None = None) -> list[Event]:
    """All SSE events of a reply, optionally truncated inside its last block."""
    start_usage = reply.usage()
    start_usage["output_tokens"] = min(1, reply.output_tokens)
    start = {
        **reply.message(),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "stop_details": None,
    }
    start["usage"] = start_usage
    events: list[Event] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    if cut is not None and not cut.finish and not reply.content:
        return events
    last = len(reply.content) - 1
    for index, block in enumerate(reply.content):
        keep = cut.keep if cut is not None and index == last else None
        events.extend(_block_events(index, block, keep))
        if keep is not None and cut is not None and not cut.finish:
            return events
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta: dict[str, Any] = {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence}
    if reply.stop_details is not None:
        delta["stop_details"] = dict(reply.stop_details)
    usage: dict[str, Any] = {
        "input_tokens": reply.input_tokens,
        "cache_creation_input_tokens": reply.cache_creation_input_tokens,
        "cache_read_input_tokens": reply.cache_read_input_tokens,
        "output_tokens": reply.output_tokens,
    }
    if reply.iterations is not None:
        usage["iterations"] = [dict(i) for i in reply.iterations]
    message_delta: dict[str, Any] = {"type": "message_delta", "delta": delta, "usage": usage}
    if reply.context_management:
        message_delta["context_management"] = dict(reply.context_management)
    events.append(("message_delta", message_delta))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _block_events(index: int, block: Mapping[str, Any], keep: float | None) -> Iterator[Event]:
    if block["type"] == "redacted_thinking":
        yield _start(index, dict(block))
    elif block["type"] == "compaction":
        # As the API streams it: the block empty, then one delta with the summary and its key.
        yield _start(index, {"type": "compaction", "content": None, "encrypted_content": None})
        yield _delta(
            index,
            {
                "type": "compaction_delta",
                "content": block["content"],
                "encrypted_content": block["encrypted_content"],
            },
        )
    elif block["type"] == "thinking":
        # As the API streams it: empty text and signature first, then the text, then the signature
        # just before the block stops (never sent for a block cut short).
        text = str(block["thinking"])
        if keep is not None:
            text = text[: _cut_length(len(text), keep)]
        yield _start(index, {"type": "thinking", "thinking": "", "signature": ""})
        for piece in chunk(text, TEXT_CHUNK_CHARS):
            yield _delta(index, {"type": "thinking_delta", "thinking": piece})
        if keep is None:
            yield _delta(index, {"type": "signature_delta", "signature": str(block.get("signature", ""))})
    elif block["type"] == "text":
        text = str(block["text"])
        if keep is not None:
            text = text[: _cut_length(len(text), keep)]
        yield _start(index, {"type": "text", "text": ""})
        for piece in chunk(text, TEXT_CHUNK_CHARS):
            yield _delta(index, {"type": "text_delta", "text": piece})
    else:
        payload = json.dumps(block["input"], ensure_ascii=False)
        if keep is not None:
            payload = payload[: _cut_length(len(payload), keep)]
        yield _start(index, {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
        for piece in ["", *chunk(payload, JSON_CHUNK_CHARS)]:
            yield _delta(index, {"type": "input_json_delta", "partial_json": piece})


def _start(index: int, content_block: dict[str, Any]) -> Event:
    return (
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": content_block},
    )


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def chunk(text: str, size: int) -> list[str]:
    """Splits into pieces of ``size`` characters, and anything longer than one character into at least two,
    so every block exercises the client's accumulation."""
    if not text:
        return []
    size = min(size, max(1, math.ceil(len(text) / 2)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _cut_length(length: int, keep: float) -> int:
    """Never the whole payload: a truncated block must stay incomplete."""
    return max(0, min(length - 1, math.floor(length * keep)))


def truncated_content(content: Sequence[Mapping[str, Any]], keep: float) -> list[dict[str, Any]]:
    """The non-streaming view of a max_tokens truncation: the last block cut like its streamed form, a tool
    input reduced to the top-level properties that were complete at the cut."""
    blocks = [dict(block) for block in content]
    if not blocks:
        return blocks
    last = blocks[-1]
    if last["type"] == "text":
        last["text"] = last["text"][: _cut_length(len(last["text"]), keep)]
    elif last["type"] == "thinking":
        last["thinking"] = last["thinking"][: _cut_length(len(last["thinking"]), keep)]
        last["signature"] = ""
    elif last["type"] == "redacted_thinking":
        pass
    else:
        full: dict[str, Any] = last["input"]
        limit = _cut_length(len(json.dumps(full, ensure_ascii=False)), keep)
        kept: dict[str, Any] = {}
        for key, value in full.items():
            candidate = {**kept, key: value}
            if len(json.dumps(candidate, ensure_ascii=False)) - 1 > limit:
                break
            kept = candidate
        last["input"] = kept
    return blocks


def sse(event: Event) -> bytes:
    name, data = event
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()
