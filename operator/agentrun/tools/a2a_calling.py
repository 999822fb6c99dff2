"""The A2A tool: a remote agent, spoken to over A2A 1.0's JSON-RPC binding (agentrun/a2a/protocol.py).

One tool per remote agent, whose input is the message, rather than one per skill: A2A sends a message to
the agent, never to a skill (a skill only describes what the agent can do), so per-skill tools would
be one endpoint under several names. The card's skills are in the tool's description instead.

The card is read once when the run starts (the description is part of the cached prompt prefix). Each
call sends one SendMessage whose messageId is the call's idempotency key, the same for every retry and
after an operator restart; transport failures and 5xx are retried twice. The send asks to be answered
at once (returnImmediately), so the task's id is known: the task is read again (GetTask) until it ends,
and one still running at the deadline, or when the run is canceled, is canceled on the remote too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from agentrun.a2a import protocol
from agentrun.api.tool_specs import A2ATool as A2AToolSpec
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.tools.body_reading import read_capped
from agentrun.tools.environment import ToolStartError

Sleep = Callable[[float], Awaitable[None]]

START_DELAYS = (1.0, 2.0, 4.0)  # the card: 4 attempts over about 7 s, then the run fails
RETRY_DELAYS = (0.5, 1.0)  # a request: two retries after the first attempt
POLL_SECONDS = 1.0
MAX_ANSWER_BYTES = 1_048_576
DESCRIPTION_CHARS = 4000
#: Time the tool keeps beyond timeoutSeconds, so its own deadline (which cancels the remote task) comes first.
CANCEL_MARGIN_SECONDS = 5.0
INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "message": {
            "type": "string",
            "description": "The whole task for the remote agent: it sees nothing else of this conversation.",
        }
    },
    "required": ["message"],
    "additionalProperties": False,
}


class Unanswered(Exception):
    """A request that got no usable answer (no connection, 5xx): retried, then reported."""


class A2AEndpoint:
    """One remote agent's JSON-RPC endpoint, with the headers from the tool's Secret."""

    def __init__(self, url: str, headers: Mapping[str, str], *, sleep: Sleep = asyncio.sleep) -> None:
        self.url = url
        self._headers = {**headers, protocol.VERSION_HEADER: protocol.PROTOCOL_VERSION}
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def get_json(self, url: str) -> Any:
        """A document (the card): any answer outside 2xx is a refusal, whatever its body says."""
        async with self.http().get(url, headers=self._headers, allow_redirects=False) as response:
            answer = await _decoded(response)
            if response.status >= 300:
                said = json.dumps(answer)[:300]
                raise protocol.RPCError(protocol.INVALID_REQUEST, f"HTTP {response.status}: {said}")
            return answer

    async def call(self, method: str, params: Mapping[str, Any], retry_delays: tuple[float, ...]) -> Any:
        """The JSON-RPC result; an error answer raises RPCError, no answer after the retries Unanswered."""
        body = protocol.request(str(uuid.uuid4()), method, params)
        last = ""
        for attempt in range(len(retry_delays) + 1):
            if attempt:
                await self._sleep(retry_delays[attempt - 1])
            try:
                async with self.http().post(
                    self.url, json=body, headers=self._headers, allow_redirects=False
                ) as response:
                    answer = await _decoded(response)
            except (aiohttp.ClientError, Unanswered) as exc:
                last = str(exc) or type(exc).__name__
                continue
            error = answer.get("error") if isinstance(answer, dict) else None
            if isinstance(error, dict):
                code = error.get("code")
                message = str(error.get("message") or "")
                raise protocol.RPCError(code if isinstance(code, int) else protocol.INTERNAL_ERROR, message)
            if not isinstance(answer, dict) or not isinstance(answer.get("result"), dict):
                raise protocol.RPCError(protocol.INTERNAL_ERROR, "the answer is not a JSON-RPC result")
            return answer["result"]
        raise Unanswered(f"{method} failed after {len(retry_delays) + 1} attempts ({last})")


async def _decoded(response: aiohttp.ClientResponse) -> Any:
    raw = await read_capped(response.content, MAX_ANSWER_BYTES + 1)
    if response.status >= 500:
        raise Unanswered(f"HTTP {response.status}")
    try:
        answer = json.loads(raw[:MAX_ANSWER_BYTES]) if len(raw) <= MAX_ANSWER_BYTES else None
    except ValueError:
        answer = None
    if response.status in (401, 403):
        error = answer.get("error") if isinstance(answer, dict) else None
        said = str(error.get("message")) if isinstance(error, dict) else raw[:300].decode(errors="replace")
        raise PermissionError(f"HTTP {response.status}: {said}")
    if answer is None:
        raise protocol.RPCError(
            protocol.INTERNAL_ERROR, f"HTTP {response.status}: the answer is not JSON (or above 1 MiB)"
        )
    if response.status >= 300 and not (isinstance(answer, dict) and "error" in answer):
        raise protocol.RPCError(
            protocol.INTERNAL_ERROR, f"HTTP {response.status}: {json.dumps(answer)[:300]}"
        )
    return answer


def endpoint_of(card: Any, card_url: str) -> str:
    """The JSON-RPC URL of the card's A2A 1.x interface; a card without one cannot be called here."""
    if not isinstance(card, dict):
        raise ValueError(f"the Agent Card at {card_url} is not a JSON object")
    for interface in card.get("supportedInterfaces") or []:
        if not isinstance(interface, dict) or interface.get("protocolBinding") != protocol.BINDING:
            continue
        version = str(interface.get("protocolVersion") or "")
        if version.split(".")[0] == protocol.PROTOCOL_VERSION.split(".")[0] and interface.get("url"):
            return str(interface["url"])
    if card.get("url") and card.get("protocolVersion"):
        raise ValueError(
            f"the agent at {card_url} speaks A2A {card['protocolVersion']} only; this tool speaks "
            f"{protocol.PROTOCOL_VERSION} (JSON-RPC)"
        )
    raise ValueError(
        f"the Agent Card at {card_url} names no A2A {protocol.PROTOCOL_VERSION} JSON-RPC interface"
    )


def describe(card: Mapping[str, Any]) -> str:
    """The tool's description from the card: what the agent says it does, then each skill."""
    lines = [f"Send a task to the remote agent {card.get('name') or '(unnamed)'} (A2A) and get its answer."]
    if card.get("description"):
        lines.append(str(card["description"]))
    skills = [s for s in card.get("skills") or [] if isinstance(s, Mapping)]
    if skills:
        lines.append("Its skills:")
    for skill in skills:
        line = f"- {skill.get('name') or skill.get('id')}: {skill.get('description') or ''}"
        examples = [str(e) for e in skill.get("examples") or []][:3]
        if examples:
            line += f" (e.g. {'; '.join(examples)})"
        lines.append(line)
    text = "\n".join(lines)
    return text if len(text) <= DESCRIPTION_CHARS else text[: DESCRIPTION_CHARS - 3] + "..."


async def open_remote(
    spec: A2AToolSpec,
    headers: Mapping[str, str],
    where: str,
    stack: contextlib.AsyncExitStack,
    *,
    sleep: Sleep = asyncio.sleep,
    start_delays: tuple[float, ...] = START_DELAYS,
) -> A2ATool:
    """The tool, its card read (retried on transport failures and 5xx, then ToolStartError)."""
    card_url = spec.url.rstrip("/") + protocol.CARD_PATH
    reader = A2AEndpoint(card_url, headers, sleep=sleep)
    stack.push_async_callback(reader.close)
    attempts = len(start_delays) + 1
    for attempt in range(attempts):
        try:
            card = await reader.get_json(card_url)
            break
        except (aiohttp.ClientError, Unanswered, TimeoutError) as exc:
            if attempt + 1 == attempts:
                raise ToolStartError(
                    f"{where}.a2a: the Agent Card at {card_url} could not be read after {attempts} attempts: "
                    f"{str(exc) or type(exc).__name__}"
                ) from None
            await sleep(start_delays[attempt])
        except (PermissionError, protocol.RPCError) as exc:
            raise ToolStartError(f"{where}.a2a: the Agent Card at {card_url} was refused: {exc}") from None
    try:
        url = endpoint_of(card, card_url)
    except ValueError as exc:
        raise ToolStartError(f"{where}.a2a: {exc}") from None
    remote = A2AEndpoint(url, headers, sleep=sleep)
    stack.push_async_callback(remote.close)
    definition = ToolDefinition(
        spec.name,
        spec.description or describe(card),
        INPUT_SCHEMA,
        timeout_seconds=spec.timeout_seconds + CANCEL_MARGIN_SECONDS,
    )
    return A2ATool(remote, definition, timeout_seconds=spec.timeout_seconds)


class A2ATool:
    def __init__(
        self,
        remote: A2AEndpoint,
        definition: ToolDefinition,
        *,
        timeout_seconds: float,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.definition = definition
        self._remote = remote
        self._timeout = timeout_seconds
        self._retry_delays = retry_delays
        self._poll = poll_seconds

    async def call(self, call: ToolCall) -> ToolOutput:
        text = call.input.get("message")
        if not isinstance(text, str) or not text.strip():
            raise ToolError(
                "invalid_input", "input.message must be a non-empty string", hint="nothing was sent"
            )
        message = protocol.text_message(text, message_id=call.idempotency_key)
        deadline = time.monotonic() + self._timeout
        task: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(self._timeout):
                # Answered at once with the task: its id is known for GetTask, and for CancelTask at the end.
                params = {"message": message, "configuration": {"returnImmediately": True}}
                answer = await self._remote.call(protocol.SEND, params, self._retry_delays)
                if isinstance(answer.get("message"), dict):
                    return ToolOutput(protocol.text_of(answer["message"].get("parts")))
                task = answer.get("task") if isinstance(answer.get("task"), dict) else None
                if task is None:
                    raise ToolError(
                        "a2a_error", f"{self.definition.name}: the answer holds no task nor message"
                    )
                while protocol.state_of(task) not in protocol.TERMINAL | protocol.INTERRUPTED:
                    if not isinstance(task.get("id"), str):
                        raise ToolError("a2a_error", f"{self.definition.name}: its unfinished task has no id")
                    await asyncio.sleep(min(self._poll, max(0.0, deadline - time.monotonic())))
                    task = await self._remote.call(protocol.GET_TASK, {"id": task["id"]}, self._retry_delays)
        except TimeoutError:
            await self._cancel(task)
            raise ToolError(
                "timeout",
                f"{self.definition.name} did not finish within {self._timeout:g}s; its task was canceled",
                hint="ask for less at once, or try later",
            ) from None
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel(task))
            raise
        except PermissionError as exc:
            raise ToolError(
                "forbidden",
                f"{self.definition.name} refused the operator's credentials ({exc})",
                recoverable=False,
            ) from None
        except Unanswered as exc:
            raise ToolError(
                "unavailable",
                f"{self.definition.name}: {exc}",
                hint="the remote agent is unavailable; try later",
            ) from None
        except protocol.RPCError as exc:
            raise ToolError("a2a_error", f"{self.definition.name} answered with an error: {exc}") from None
        return self._outcome(task)

    async def _cancel(self, task: Mapping[str, Any] | None) -> None:
        """Best effort: a task left running would go on spending on the remote side for nobody."""
        if task is None or not task.get("id"):
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self._remote.call(protocol.CANCEL_TASK, {"id": task["id"]}, ())

    def _outcome(self, task: Mapping[str, Any]) -> ToolOutput:
        state, name = protocol.state_of(task), self.definition.name
        if state == protocol.COMPLETED:
            return ToolOutput(protocol.task_text(task))
        said = protocol.status_text(task) or "(no message)"
        if state in protocol.INTERRUPTED:
            raise ToolError(
                "input_required",
                f"{name} asks for more ({state}): {said}",
                hint="this tool cannot answer the remote agent: send a new message with all it needs",
            )
        raise ToolError("remote_failed", f"{name} ended its task {state}: {said}", hint="")
