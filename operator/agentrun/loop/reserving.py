"""The most one model request can cost, reserved against the quotas before it is sent.

A reservation must never be smaller than what the API then bills, or concurrent runs could pass a
quota together; a generous one only makes a run wait or stop a little early. So the input side is
an upper bound, not an estimate:

- UTF-8 bytes bound tokens. A byte-level BPE tokenizer never makes a token of less than one byte,
  and the JSON of a message (keys, quotes, brackets) is longer than the text the model reads.
- When the previous request of this process was answered, its exact input (as the API reported it)
  is the base, and only what differs from that request is counted in bytes: every message that is
  new or changed (the answer itself, tool results, a message whose old results were cleared). A
  changed message is counted whole while the old one stays in the base, which can only overcount.
  The answer is counted in bytes too, not as the output tokens it was billed: read back as input
  (re-tokenized, tool calls rendered into the prompt) it can take more tokens than it was written in.
- Otherwise (the first request of a run or of a resumed run, after the loop's own compaction, after
  a compaction on the server, a different system prompt or tool list) the whole request is counted
  in bytes: system prompt, tool definitions and messages.
- `API_PROMPT_MARGIN` tokens are added to both for what the API adds itself: the tool-use system
  prompt (published per model and tool_choice: 313 to 346 tokens for Claude 4 models, 530 at most
  for any model), which the previous request's count may not hold (tool_choice none on a final
  turn), and the few bytes the adapter adds to the JSON we measure (at most four cache_control
  marks, the system prompt as a block). About twice the largest of those, so a model with a
  somewhat longer tool prompt still fits.

The output side is `max_tokens`: the API never writes more in one request (thinking included).

A compaction on the server (spec.context.compaction.strategy Server) is a second model call inside
the request, billed on top and reported in `usage.iterations` only: it reads at most the whole
request and writes a summary, then the answer reads at most the request plus that summary. The
summary's length is not published; it is bounded here by `max_tokens` as well. It is counted only
when the request can reach the compaction trigger (the API's default is 150,000 input tokens): a
request whose input bound is below the trigger cannot compact. The usage the fake Messages API
reports (4 characters a token, a summary of one line) stays below every bound here
(tests/unit/loop/test_quota_reservations.py).

Cost is that bound priced at the dearest input rate (input or cache write: which part the cache
serves is not known before the answer) and the output rate; None when the model has no price.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentrun.api.usage import TokenUsage
from agentrun.loop.protocols import Message, ModelRequest, Pricer, Spend, ToolDefinition
from agentrun.loop.state import Compaction

#: Tokens the API adds to a request's input besides what we send (see the module docstring).
API_PROMPT_MARGIN = 1024
#: The input tokens at which the API compacts when the request names no trigger.
SERVER_COMPACTION_TRIGGER = 150_000


def utf8_bytes(value: Any) -> int:
    """Bytes of `value` as compact JSON (a string as its text)."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode())


@dataclass(frozen=True)
class Bound:
    input_tokens: int
    output_tokens: int

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def spend(self, model: str, pricer: Pricer) -> Spend:
        return Spend(self.tokens, self.cost(model, pricer))

    def cost(self, model: str, pricer: Pricer) -> Decimal | None:
        n = self.input_tokens
        inputs = [
            pricer.cost(model, TokenUsage(input_tokens=n)),
            pricer.cost(model, TokenUsage(cache_creation_input_tokens=n)),
            pricer.cost(model, TokenUsage(cache_read_input_tokens=n)),
        ]
        output = pricer.cost(model, TokenUsage(output_tokens=self.output_tokens))
        if output is None or any(cost is None for cost in inputs):
            return None
        return max(cost for cost in inputs if cost is not None) + output


@dataclass(frozen=True)
class Basis:
    """The last answered request the next one is measured against, and its exact input."""

    messages: Sequence[Message]
    system: str | None
    tools: tuple[ToolDefinition, ...]
    compaction: Compaction | None
    input_tokens: int


class RequestSizer:
    """Bounds of the requests of one run, kept in memory only: a resumed run (or one that lost
    its basis) measures its next request whole, so nothing new is persisted for it."""

    def __init__(self) -> None:
        self.basis: Basis | None = None

    def bound(self, request: ModelRequest, compaction: Compaction | None) -> Bound:
        """The most `request` can bill, given the state's current compaction (the loop's own)."""
        read = self.input_bound(request, compaction)
        server = request.server_context
        if server is None or not server.compact:
            return Bound(read, request.max_tokens)
        trigger = server.compact_trigger_tokens or SERVER_COMPACTION_TRIGGER
        if read < trigger:
            return Bound(read, request.max_tokens)
        # The compaction reads the request and writes a summary; the answer reads at most both.
        summary = request.max_tokens
        return Bound(read + read + summary, summary + request.max_tokens)

    def input_bound(self, request: ModelRequest, compaction: Compaction | None) -> int:
        basis = self.basis
        tools = tuple(request.tools)
        if (
            basis is None
            or basis.compaction is not compaction
            or basis.system != request.system
            or basis.tools != tools
        ):
            whole = (
                utf8_bytes(request.system or "")
                + utf8_bytes([tool.as_api() for tool in tools])
                + sum(tool.api_prompt_tokens for tool in tools)
                + utf8_bytes(list(request.messages))
            )
            return whole + API_PROMPT_MARGIN
        added = 0
        for index, message in enumerate(request.messages):
            if index < len(basis.messages):
                old = basis.messages[index]
                if old is message or old == message:
                    continue
            added += utf8_bytes(message)
        return basis.input_tokens + added + API_PROMPT_MARGIN

    def learn(self, request: ModelRequest, compaction: Compaction | None, input_tokens: int | None) -> None:
        """`request` was answered having read `input_tokens` (None: not a basis, e.g. the server
        compacted it, so what the next request reads is measured whole)."""
        if input_tokens is None:
            self.basis = None
            return
        self.basis = Basis(
            list(request.messages), request.system, tuple(request.tools), compaction, input_tokens
        )


def first_request_floor(model: str, system: str | None, task: str, max_tokens: int, pricer: Pricer) -> Spend:
    """The least a run's first request will reserve: its system prompt and task, the margin and
    max_tokens, without the tool definitions (MCP tools are only known once their servers start).

    Admission asks the quotas for this much room, so a run is not started only to be refused at its
    first request; the reservation of that request is still checked in full.
    """
    return Bound(utf8_bytes(system or "") + utf8_bytes(task) + API_PROMPT_MARGIN, max_tokens).spend(
        model, pricer
    )
