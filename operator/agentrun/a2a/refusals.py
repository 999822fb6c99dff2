"""How a failed A2A request is answered: a JSON-RPC error object, with an HTTP status of its own only
where A2A asks for one (401 without an accepted token, 403 where RBAC says no, 404 for no such Agent)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from agentrun.a2a import protocol
from agentrun.kube.errors import APIError, APIForbiddenError, APIInvalidError, APIUnauthorizedError


class Refused(Exception):
    """A request answered with an HTTP status of its own (no credentials, not allowed, no such Agent)."""

    def __init__(
        self, status: int, error: protocol.RPCError, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(error.message)
        self.status, self.error, self.headers = status, error, dict(headers or {})


def refusal_of(exc: APIError) -> Refused | protocol.RPCError:
    """The API server's refusal of a caller's request, told to the caller as the server words it."""
    if isinstance(exc, APIUnauthorizedError):
        return Refused(
            401, protocol.RPCError(protocol.INVALID_REQUEST, f"the API server refused the token: {exc}")
        )
    if isinstance(exc, APIForbiddenError):
        return Refused(403, protocol.RPCError(protocol.INVALID_REQUEST, f"the API server refused: {exc}"))
    if isinstance(exc, APIInvalidError):
        return protocol.RPCError(protocol.INVALID_PARAMS, f"the API server refused the run: {exc}")
    return protocol.RPCError(protocol.INTERNAL_ERROR, f"the API server failed: {exc}")


def json_answer(
    body: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=dict(headers or {})
    )
