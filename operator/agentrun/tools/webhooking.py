"""Webhook tools: the validated input POSTed as JSON to a URL or an in-cluster Service.

Only the loop's per-call timeout bounds a whole call; retries here are for answers that say
nothing happened (5xx, refused connections). Every attempt carries the same Idempotency-Key, so a
receiver that saw an earlier attempt (or the same call before an operator restart) can de-duplicate.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import jsonschema
import referencing

from agentrun.api.json_schemas import json_schema_problem, json_schema_validator_class
from agentrun.api.tool_specs import HTTPTool
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.tools.body_reading import read_capped

Sleep = Callable[[float], Awaitable[None]]

RETRY_DELAYS = (0.5, 1.0)  # two retries after the first attempt
MAX_RESPONSE_BYTES = 1_048_576
HINT_CHARS = 500


def endpoint(tool: HTTPTool, namespace: str) -> str:
    if tool.url is not None:
        return tool.url
    if tool.service is None:  # pragma: no cover - the registry checks this first
        raise ValueError("neither url nor service")
    service = tool.service
    path = service.path if service.path.startswith("/") else f"/{service.path}"
    return f"{service.scheme}://{service.name}.{service.namespace or namespace}.svc:{service.port}{path}"


def body_message(text: str) -> str:
    """What the receiver said went wrong, from the usual JSON error shapes, else the raw text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:HINT_CHARS]
    if isinstance(body, dict):
        for key in ("message", "error", "detail", "title"):
            value = body.get(key)
            if isinstance(value, dict) and isinstance(value.get("message"), str):
                return str(value["message"])[:HINT_CHARS]
            if isinstance(value, str) and value:
                return value[:HINT_CHARS]
    return text.strip()[:HINT_CHARS]


class WebhookTool:
    def __init__(
        self,
        spec: HTTPTool,
        *,
        url: str,
        headers: Mapping[str, str],
        sleep: Sleep = asyncio.sleep,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        definition: ToolDefinition,
    ) -> None:
        self.definition = definition
        self._spec = spec
        self._url = url
        self._headers = dict(headers)
        self._sleep = sleep
        self._retry_delays = retry_delays
        # An empty registry: a $ref is only ever resolved inside the schema, never fetched.
        validator = json_schema_validator_class(spec.input_schema) or jsonschema.Draft202012Validator
        self._validator = validator(spec.input_schema, registry=referencing.Registry())

    async def call(self, call: ToolCall) -> ToolOutput:
        errors = sorted(self._validator.iter_errors(dict(call.input)), key=lambda e: list(e.absolute_path))
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.absolute_path) or "(root)"
            raise ToolError(
                "invalid_input",
                f"input does not match the tool's inputSchema at {where}: {first.message}",
                hint="fix the input to match the schema; nothing was sent",
            )
        body = json.dumps(dict(call.input)).encode()
        headers = {
            **self._headers,
            "Content-Type": "application/json",
            "Idempotency-Key": call.idempotency_key,
        }
        timeout = aiohttp.ClientTimeout(total=self._spec.timeout_seconds)
        attempts = len(self._retry_delays) + 1
        last = ""
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(attempts):
                if attempt:
                    await self._sleep(self._retry_delays[attempt - 1])
                try:
                    status, text = await self._post(session, body, headers)
                except TimeoutError:
                    raise ToolError(
                        "timeout",
                        f"{self.definition.name} did not answer within {self._spec.timeout_seconds:g}s",
                        hint="the request may still have been processed; retrying reuses the same key",
                    ) from None
                except aiohttp.ClientError as exc:
                    last = f"connection failed: {type(exc).__name__}"
                    continue
                if status >= 500:
                    last = f"HTTP {status}: {body_message(text)}"
                    continue
                return self._answer(status, text)
        raise ToolError(
            "unavailable",
            f"{self.definition.name} failed after {attempts} attempts ({last})",
            hint="the service is unavailable; try later or use another tool",
        )

    async def _post(
        self, session: aiohttp.ClientSession, body: bytes, headers: Mapping[str, str]
    ) -> tuple[int, str]:
        async with session.post(self._url, data=body, headers=headers, allow_redirects=False) as response:
            raw = await read_capped(response.content, MAX_RESPONSE_BYTES + 1)
            text = raw[:MAX_RESPONSE_BYTES].decode(response.charset or "utf-8", errors="replace")
            if len(raw) > MAX_RESPONSE_BYTES:
                text += f"\n[... answer cut at {MAX_RESPONSE_BYTES} bytes]"
            return response.status, text

    def _answer(self, status: int, text: str) -> ToolOutput:
        if status < 300:
            return ToolOutput(text)
        message = body_message(text)
        if status in (401, 403):
            raise ToolError(
                "unauthorized" if status == 401 else "forbidden",
                f"{self.definition.name} refused the operator's credentials (HTTP {status})",
                hint=message,
                recoverable=self._spec.auth_errors_recoverable,
            )
        if 300 <= status < 400:
            raise ToolError(
                "redirected", f"{self.definition.name} answered HTTP {status} (redirects are not followed)"
            )
        raise ToolError(
            "rejected", f"{self.definition.name} rejected the request (HTTP {status})", hint=message
        )


def check_schema(schema: Mapping[str, Any]) -> str | None:
    """Why the inputSchema is not a usable JSON Schema for an object input, or None."""
    problem = json_schema_problem(dict(schema))
    if problem is not None:
        return problem
    if schema.get("type") != "object":
        return "the Messages API needs an object schema: set type: object"
    return None
