"""Scripts for the fake Messages API: what the fake model answers at each step, and which faults come first.

A script is one conversation. Its steps are indexed by the number of ``assistant`` messages already in the
request, so the server needs no per-client state: a client that restarts and resends the history is served
the right next step. A step is a :class:`Reply` (optionally preceded by transient faults) or a bare fault,
which is then served on every request for that step (a permanent failure).

File format (YAML or JSON; one file may hold several scripts)::

    scripts:
      - name: tool-then-answer              # optional, defaults to `match`, then `model`
        match: "[scenario:tool-then-answer]" # substring of the first user message's text
        model: fake-model                    # optional: select by the request's `model` instead / as well
        steps:
          - faults:                          # optional; served in order before the reply
              - {kind: http_error, error_type: rate_limit_error, headers: {retry-after: "1"}, times: 2}
            reply:
              content:
                - {type: text, text: "Let me look."}
                - {type: tool_use, name: list_pods, input: {namespace: default}}   # id optional
                # also {type: thinking, thinking: "..."} (signature optional) and
                # {type: redacted_thinking, data: "..."}: the request must turn thinking on
              stop_reason: tool_use          # optional: tool_use if there is a tool_use block, else end_turn
              unknown_stop_reason: null      # opt-in: a stop_reason the API does not define, sent verbatim
              stop_sequence: null
              stop_details: null             # e.g. {type: refusal, category: cyber, explanation: "..."}
              usage: {input_tokens: 120, output_tokens: 30, cache_creation_input_tokens: 0,
                      cache_read_input_tokens: 100}   # any field left out is estimated
              delay_seconds: 0               # before the response starts
              chunk_delay_seconds: 0         # between SSE events
              headers: {}                    # extra response headers
          - fault: {kind: http_error, error_type: authentication_error}   # bare: served every time

Fault kinds and their fields (all take ``times``, default 1):

- ``http_error``: ``error_type``, ``status`` (default from the type, e.g. 429, 529), ``message``, ``headers``
- ``stream_error``: ``error_type`` (default ``overloaded_error``), ``message``
- ``connection_reset``: ``during``: ``headers`` (before any byte) or ``body`` (after part of the body)
- ``slow_response``: ``seconds`` to wait before the headers
- ``truncated_stream``: ``mode``: ``max_tokens`` or ``cut``; ``keep``: fraction of the last block sent

Python scripts reach a child server through a file: ``yaml.safe_dump(scripts_to_data(scripts))``
(:mod:`agentrun_sandbox.messages.script_files`).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeAlias, get_args

StopReason: TypeAlias = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
]
STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

#: HTTP status the real API uses for each error type; a fault that names only the type gets this status.
ERROR_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

_DEFAULT_ERROR_MESSAGES: Mapping[str, str] = {
    "invalid_request_error": "Invalid request.",
    "authentication_error": "invalid x-api-key",
    "billing_error": "Your credit balance is too low to access the Anthropic API.",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "Not found.",
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
    "rate_limit_error": "Number of request tokens has exceeded your per-minute rate limit.",
    "api_error": "Internal server error",
    "timeout_error": "Request timed out",
    "overloaded_error": "Overloaded",
}


def default_error_message(error_type: str) -> str:
    """Gives faults a realistic message so logs in tests read like production logs."""
    return _DEFAULT_ERROR_MESSAGES.get(error_type, error_type.replace("_", " "))


def text_block(text: str) -> dict[str, Any]:
    """Spares scripts the raw-dict boilerplate for the most common block."""
    return {"type": "text", "text": text}


def tool_use_block(name: str, input: Mapping[str, Any], *, id: str | None = None) -> dict[str, Any]:
    """Leaves the id out unless given, so the server derives a realistic ``toolu_…`` id per conversation."""
    block: dict[str, Any] = {"type": "tool_use", "name": name, "input": dict(input)}
    if id is not None:
        block["id"] = id
    return block


def thinking_block(thinking: str, *, signature: str | None = None) -> dict[str, Any]:
    """Leaves the signature out unless given, so the server signs the text as the real API does; a
    follow-up request must send the block back exactly as served."""
    block: dict[str, Any] = {"type": "thinking", "thinking": thinking}
    if signature is not None:
        block["signature"] = signature
    return block


def redacted_thinking_block(data: str) -> dict[str, Any]:
    """Thinking the API encrypted: opaque ``data`` that must come back unchanged."""
    return {"type": "redacted_thinking", "data": data}


@dataclass(frozen=True)
class ScriptUsage:
    """Token counts a reply reports. ``None`` is estimated from request and reply sizes, so a script pins
    only the numbers its test asserts on."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"usage.{f.name} must be a non-negative integer, got {value!r}")


# ---------------------------------------------------------------------------------------------- faults


@dataclass(frozen=True, kw_only=True)
class Fault:
    """Something that goes wrong instead of (or before) a reply.

    In :attr:`Reply.faults` a fault is served ``times`` times for that step before the reply is, counted per
    (script, conversation, step) where a conversation is the exact text of the first user message, so an SDK
    or loop that retries sees fault, fault, …, success while runs with other tasks keep their own counts. As
    a bare step it is served on every request for that step and ``times`` is ignored.
    """

    kind: ClassVar[str] = ""
    times: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.times, int) or self.times < 1:
            raise ValueError(f"{self.kind}: times must be a positive integer, got {self.times!r}")


@dataclass(frozen=True, kw_only=True)
class HttpError(Fault):
    """An HTTP error response with the API's error body, e.g. 429 with ``retry-after`` or 529 overloaded.

    The SDK (anthropic 2.12) raises the class its status maps to (``RateLimitError``, ``OverloadedError``,
    ``InternalServerError``, …) with the headers on ``err.response``; with retries enabled it retries
    408/409/429/5xx itself, honouring ``retry-after-ms``/``retry-after`` and ``x-should-retry``.
    """

    kind: ClassVar[str] = "http_error"
    error_type: str = "api_error"
    status: int | None = None
    message: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.status is None and self.error_type not in ERROR_STATUS:
            raise ValueError(f"http_error: give a status for the unknown error type {self.error_type!r}")
        if self.status is not None and not 400 <= self.status <= 599:
            raise ValueError(f"http_error: status must be 4xx or 5xx, got {self.status!r}")
        object.__setattr__(self, "headers", {str(k).lower(): str(v) for k, v in self.headers.items()})

    @property
    def status_code(self) -> int:
        return self.status if self.status is not None else ERROR_STATUS[self.error_type]

    @property
    def error_message(self) -> str:
        return self.message if self.message is not None else default_error_message(self.error_type)

    @classmethod
    def rate_limit(
        cls, *, retry_after: float | None = 1, retry_after_ms: float | None = None, times: int = 1
    ) -> HttpError:
        """A 429 whose retry hints are the headers the SDK and the loop read."""
        headers: dict[str, str] = {}
        if retry_after is not None:
            headers["retry-after"] = _number_text(retry_after)
        if retry_after_ms is not None:
            headers["retry-after-ms"] = _number_text(retry_after_ms)
        return cls(error_type="rate_limit_error", headers=headers, times=times)

    @classmethod
    def overloaded(cls, *, times: int = 1) -> HttpError:
        """The 529 the API answers with when it sheds load."""
        return cls(error_type="overloaded_error", times=times)


@dataclass(frozen=True, kw_only=True)
class StreamError(Fault):
    """An ``error`` event inside a 200 stream after the first piece of content, as the API sends when it
    becomes overloaded mid-response. A non-streaming request gets the equivalent HTTP error instead.

    The SDK raises a plain ``APIStatusError`` (not ``OverloadedError``) with ``status_code == 200`` and
    ``err.type == "overloaded_error"``; it never retries it.
    """

    kind: ClassVar[str] = "stream_error"
    error_type: str = "overloaded_error"
    message: str | None = None

    @property
    def error_message(self) -> str:
        return self.message if self.message is not None else default_error_message(self.error_type)


@dataclass(frozen=True, kw_only=True)
class ConnectionReset(Fault):
    """A TCP reset: ``during="headers"`` before any response byte, ``"body"`` after the headers and part of
    the body (for a stream: after the first content delta).

    The SDK raises ``APIConnectionError`` for a reset before the headers and for a reset inside a JSON body,
    but a reset inside a stream escapes as a raw ``httpx2.ReadError``, which is not an ``anthropic.APIError``.
    """

    kind: ClassVar[str] = "connection_reset"
    during: Literal["headers", "body"] = "headers"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.during not in ("headers", "body"):
            raise ValueError(f"connection_reset: during must be 'headers' or 'body', got {self.during!r}")


@dataclass(frozen=True, kw_only=True)
class SlowResponse(Fault):
    """Waits ``seconds`` before sending headers (longer than the client's timeout), then serves the reply to
    whoever is still listening. The SDK raises ``APITimeoutError`` (a subclass of ``APIConnectionError``)."""

    kind: ClassVar[str] = "slow_response"
    seconds: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seconds < 0:
            raise ValueError(f"slow_response: seconds must not be negative, got {self.seconds!r}")


@dataclass(frozen=True, kw_only=True)
class TruncatedStream(Fault):
    """The reply's last block is cut after ``keep`` of its text or tool-input JSON.

    ``mode="max_tokens"`` is what a real truncation looks like: the block is closed and ``message_delta``
    carries ``stop_reason: max_tokens`` with ``output_tokens`` equal to the request's ``max_tokens``.
    ``mode="cut"`` ends the body cleanly in the middle of the block, with no ``content_block_stop``,
    ``message_delta`` or ``message_stop`` (for a non-streaming request: a JSON body cut short).

    What the SDK makes of it: with ``max_tokens`` the final message holds the tool_use with only the
    properties complete before the cut (a cut string value is dropped, so the input can look valid) and
    ``stop_reason == "max_tokens"``; a non-streaming reply carries the same. With ``cut`` a stream yields a
    final message with ``stop_reason is None`` and ``output_tokens`` from ``message_start`` (no error at
    all), while a cut JSON body raises ``APIConnectionError``.
    """

    kind: ClassVar[str] = "truncated_stream"
    mode: Literal["max_tokens", "cut"] = "max_tokens"
    keep: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in ("max_tokens", "cut"):
            raise ValueError(f"truncated_stream: mode must be 'max_tokens' or 'cut', got {self.mode!r}")
        if not 0.0 <= self.keep < 1.0:
            raise ValueError(f"truncated_stream: keep must be in [0, 1), got {self.keep!r}")


FAULT_KINDS: Mapping[str, type[Fault]] = {
    cls.kind: cls for cls in (HttpError, StreamError, ConnectionReset, SlowResponse, TruncatedStream)
}


# ---------------------------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class Reply:
    """One assistant message, as the fake model produces it.

    Content blocks are raw API dicts (``text``, ``tool_use``, ``thinking``, ``redacted_thinking``); a
    ``tool_use`` without an ``id`` gets one derived from the conversation and step, so a resent history is
    answered with the same ids, and a ``thinking`` block without a ``signature`` gets one derived from its
    text. Thinking blocks need a request with thinking on, and must come back unchanged (see
    :mod:`~agentrun_sandbox.messages.planning`).

    ``stop_reason`` must be one the API defines, so a typo in a script fails loudly. To see how a client
    copes with a value the API may add later, opt in explicitly with ``unknown_stop_reason``: it is sent
    verbatim (the SDK builds responses without strict validation, so the client receives it as is).
    """

    content: Sequence[Mapping[str, Any]] = ()
    _: KW_ONLY
    stop_reason: StopReason | None = None
    unknown_stop_reason: str | None = None
    stop_sequence: str | None = None
    stop_details: Mapping[str, Any] | None = None
    usage: ScriptUsage = field(default_factory=ScriptUsage)
    delay_seconds: float = 0.0
    chunk_delay_seconds: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    faults: Sequence[Fault] = ()

    def __post_init__(self) -> None:
        blocks = tuple(_checked_block(block, index) for index, block in enumerate(self.content))
        object.__setattr__(self, "content", blocks)
        object.__setattr__(self, "faults", tuple(self.faults))
        object.__setattr__(self, "headers", {str(k).lower(): str(v) for k, v in self.headers.items()})
        if self.stop_details is not None:
            object.__setattr__(self, "stop_details", copy.deepcopy(dict(self.stop_details)))
        if self.stop_reason is not None and self.stop_reason not in STOP_REASONS:
            raise ValueError(
                f"reply: unknown stop_reason {self.stop_reason!r}; "
                "use unknown_stop_reason to send it on purpose"
            )
        if self.unknown_stop_reason is not None:
            if self.stop_reason is not None:
                raise ValueError("reply: give stop_reason or unknown_stop_reason, not both")
            if not isinstance(self.unknown_stop_reason, str) or self.unknown_stop_reason in STOP_REASONS:
                raise ValueError(
                    f"reply: unknown_stop_reason must be a value the API does not define, "
                    f"got {self.unknown_stop_reason!r}; use stop_reason for it"
                )
        if self.delay_seconds < 0 or self.chunk_delay_seconds < 0:
            raise ValueError("reply: delays must not be negative")
        for fault in self.faults:
            if not isinstance(fault, Fault):
                raise TypeError(f"reply: faults must be Fault instances, got {fault!r}")

    @property
    def effective_stop_reason(self) -> StopReason:
        """Infers the stop reason the way the model would report it, so scripts rarely need to state it."""
        if self.stop_reason is not None:
            return self.stop_reason
        if self.stop_sequence is not None:
            return "stop_sequence"
        if any(block["type"] == "tool_use" for block in self.content):
            return "tool_use"
        return "end_turn"

    @property
    def wire_stop_reason(self) -> str:
        """What the server sends: the opted-in unknown value, else the effective one."""
        return (
            self.unknown_stop_reason if self.unknown_stop_reason is not None else self.effective_stop_reason
        )


def _checked_block(block: Mapping[str, Any], index: int) -> dict[str, Any]:
    where = f"reply.content.{index}"
    if not isinstance(block, Mapping):
        raise TypeError(f"{where}: a content block must be a mapping, got {block!r}")
    data = copy.deepcopy(dict(block))
    try:
        json.dumps(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: content must be JSON-serialisable: {err}") from err
    kind = data.get("type")
    if kind == "text":
        if not isinstance(data.get("text"), str):
            raise ValueError(f"{where}: a text block needs a string 'text'")
    elif kind == "tool_use":
        name = data.get("name")
        if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
            raise ValueError(f"{where}: tool_use name must match {TOOL_NAME_PATTERN.pattern}, got {name!r}")
        if not isinstance(data.get("input", {}), dict):
            raise ValueError(f"{where}: tool_use input must be a mapping")
        data.setdefault("input", {})
        if "id" in data and not isinstance(data["id"], str):
            raise ValueError(f"{where}: tool_use id must be a string")
    elif kind == "thinking":
        if not isinstance(data.get("thinking"), str):
            raise ValueError(f"{where}: a thinking block needs a string 'thinking'")
        if not isinstance(data.get("signature", ""), str):
            raise ValueError(f"{where}: a thinking block's signature must be a string")
    elif kind == "redacted_thinking":
        if not isinstance(data.get("data"), str) or not data["data"]:
            raise ValueError(f"{where}: a redacted_thinking block needs a non-empty string 'data'")
    else:
        raise ValueError(
            f"{where}: only 'text', 'tool_use', 'thinking' and 'redacted_thinking' blocks can be "
            f"scripted, got {kind!r}"
        )
    return data


Step: TypeAlias = Reply | Fault


@dataclass(frozen=True)
class Script:
    """A scripted conversation, chosen by a substring of the first user message and/or the model name."""

    match: str | None
    steps: Sequence[Step]
    _: KW_ONLY
    model: str | None = None
    name: str | None = None
    #: Input tokens (estimated as usage is) above which a request is refused as the real API refuses
    #: one: 400 invalid_request_error "prompt is too long: N tokens > M maximum". None: no limit.
    context_window: int | None = None

    def __post_init__(self) -> None:
        if not self.match and not self.model:
            raise ValueError("script: give a non-empty `match` or a `model` to select it by")
        steps = tuple(self.steps)
        for index, step in enumerate(steps):
            if not isinstance(step, Reply | Fault):
                raise TypeError(f"script {self.key!r}: step {index} must be a Reply or a Fault, got {step!r}")
        object.__setattr__(self, "steps", steps)

    @property
    def key(self) -> str:
        """The name fault counters and recorded requests use for this script."""
        return self.name or self.match or self.model or ""

    def matches(self, first_user_text: str, model: str) -> bool:
        if self.match and self.match not in first_user_text:
            return False
        return not (self.model and self.model != model)


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
