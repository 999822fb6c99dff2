"""Prompt caching as the real API does it, for a fake server asked to (``prompt_cache=True``).

The prompt is read as one sequence of blocks: each tool definition, each system block, then each
content block of each message. A ``cache_control`` mark on a block caches the prefix that ends there,
for requests of the same model and thinking settings; a later request reads the longest cached prefix
that ends at one of its marks or up to :data:`LOOKBACK_BLOCKS` blocks before one. Usage then splits
the input as the API's does: ``cache_read_input_tokens`` (the prefix read), ``cache_creation_input_tokens``
(from there to the last mark, written now) and ``input_tokens`` (the rest). Prefixes shorter than
:data:`MIN_CACHEABLE_TOKENS` are not cached. Entries never expire: a test is shorter than the 5-minute
lifetime. Token counts are the per-block estimates of :func:`~agentrun_sandbox.messages.wire.estimate_tokens`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun_sandbox.messages.wire import estimate_tokens

#: How many blocks before a mark the API looks for an earlier cache entry.
LOOKBACK_BLOCKS = 20
#: The shortest prefix the API caches (Claude Sonnet and Opus; smaller models need more).
MIN_CACHEABLE_TOKENS = 1024


@dataclass(frozen=True)
class CacheUsage:
    """The input side of one request's usage."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


def prompt_blocks(body: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every block of the prompt in cache order, without its mark, and whether it was marked."""
    system = body.get("system")
    sections: list[tuple[str, list[Any]]] = [
        ("tool", list(body.get("tools") or [])),
        ("system", [{"type": "text", "text": system}] if isinstance(system, str) else list(system or [])),
    ]
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        role = str(message.get("role")) if isinstance(message, dict) else "?"
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        sections.append((role, blocks))
    for where, blocks in sections:
        for block in blocks:
            if not isinstance(block, dict):
                continue
            yield (
                {"in": where, **{k: v for k, v in block.items() if k != "cache_control"}},
                "cache_control" in block,
            )


class PromptCache:
    """The prefixes earlier requests cached on this server."""

    def __init__(self) -> None:
        self._prefixes: set[str] = set()

    def use(self, body: Mapping[str, Any]) -> CacheUsage:
        """Reads what the request can read from the cache, writes what its marks ask for."""
        seed = json.dumps([body.get("model"), body.get("thinking")], sort_keys=True)
        digest = hashlib.sha256(seed.encode())
        prefixes: list[tuple[str, int]] = []  # (key, tokens) of the prefix ending at each block
        marks: list[int] = []
        tokens = 0
        for index, (block, marked) in enumerate(prompt_blocks(body)):
            digest.update(json.dumps(block, sort_keys=True, separators=(",", ":")).encode())
            tokens += estimate_tokens(block)
            prefixes.append((digest.copy().hexdigest(), tokens))
            if marked:
                marks.append(index)
        read = 0
        for mark in marks:
            for index in range(mark, max(-1, mark - LOOKBACK_BLOCKS), -1):
                key, length = prefixes[index]
                if key in self._prefixes:
                    read = max(read, length)
                    break
        written = 0
        for mark in marks:
            key, length = prefixes[mark]
            if length >= MIN_CACHEABLE_TOKENS:
                self._prefixes.add(key)
                written = max(written, length - read)
        return CacheUsage(tokens - read - written, read, written)
