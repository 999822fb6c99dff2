"""Amazon Bedrock's and Google Vertex AI's doors into the same scripted model.

Bedrock: ``POST /model/{modelId}/invoke`` and ``/invoke-with-response-stream`` (SigV4-signed for the
account's region and service ``bedrock``, or a Bedrock API key), the model in the path, the body the
Messages API's with ``anthropic_version`` in it and betas as ``anthropic_beta``; ``POST /sts/`` is
the account's STS (AssumeRoleWithWebIdentity). Vertex AI: ``POST /v1/projects/{project}/locations/
{region}/publishers/anthropic/models/{model}:rawPredict`` or ``:streamRawPredict`` with an OAuth
bearer token from ``POST /token`` (the service accounts' token endpoint), betas in the
``anthropic-beta`` header as on Anthropic's API.

Each door checks what its cloud checks, then hands the request, rewritten into a Messages API body,
to :meth:`FakeMessagesAPI.answer` with its own wire form (:mod:`~agentrun_sandbox.messages.dialects`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agentrun_sandbox.messages.dialects import BEDROCK, VERTEX, Dialect
from agentrun_sandbox.messages.wire import new_request_id

if TYPE_CHECKING:
    from agentrun_sandbox.messages.api import FakeMessagesAPI

VERTEX_PATH = "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{call}"


class CloudDoors:
    def __init__(self, api: FakeMessagesAPI) -> None:
        self._api = api

    def register(self, app: web.Application) -> None:
        app.router.add_post("/model/{model}/invoke", self._bedrock)
        app.router.add_post("/model/{model}/invoke-with-response-stream", self._bedrock)
        app.router.add_post("/sts/", self._api.aws.sts)
        app.router.add_post(VERTEX_PATH, self._vertex)
        app.router.add_post("/token", self._api.google.token_endpoint)

    async def _bedrock(self, request: web.Request) -> web.StreamResponse:
        request_id = new_request_id()
        raw = await request.read()
        body = _json(raw)
        url = f"{request.scheme}://{request.host}{request.raw_path}"
        refusal = self._api.aws.refusal(request.method, url, request.headers, raw)
        if refusal is not None:
            return self._refused(request, request_id, body, refusal, BEDROCK)
        stream = request.path.endswith("/invoke-with-response-stream")
        betas = body.pop("anthropic_beta", None) if isinstance(body, dict) else None
        if betas is not None and not (isinstance(betas, list) and all(isinstance(b, str) for b in betas)):
            return self._api.refuse(
                request, request_id, body, "anthropic_beta: must be a list of strings", BEDROCK
            )
        return await self._answer(
            request, request_id, body, request.match_info["model"], stream, set(betas or ()), BEDROCK
        )

    async def _vertex(self, request: web.Request) -> web.StreamResponse:
        request_id = new_request_id()
        body = _json(await request.read())
        refusal = self._api.google.refusal(request.headers)
        if refusal is not None:
            return self._refused(request, request_id, body, refusal, VERTEX)
        info = request.match_info
        model, _, method = info["call"].rpartition(":")
        if method not in ("rawPredict", "streamRawPredict") or not model:
            return self._refused(
                request, request_id, body, (404, "not_found_error", f"{info['call']} is not a method"), VERTEX
            )
        google = self._api.google
        if (info["project"], info["region"]) != (google.project, google.region):
            where = f"projects/{info['project']}/locations/{info['region']}"
            return self._refused(
                request, request_id, body, (403, "permission_error", f"Permission denied on {where}"), VERTEX
            )
        betas = {b.strip() for b in request.headers.get("anthropic-beta", "").split(",") if b.strip()}
        return await self._answer(
            request, request_id, body, model, method == "streamRawPredict", betas, VERTEX
        )

    async def _answer(
        self,
        request: web.Request,
        request_id: str,
        body: Any,
        model: str,
        stream: bool,
        betas: set[str],
        dialect: Dialect,
    ) -> web.StreamResponse:
        if not isinstance(body, dict) or not isinstance(body.get("anthropic_version"), str):
            return self._api.refuse(request, request_id, body, "anthropic_version: Field required", dialect)
        if "model" in body:
            return self._api.refuse(
                request, request_id, body, "model: extraneous key [model] is not permitted", dialect
            )
        if dialect is BEDROCK and "stream" in body:
            return self._api.refuse(
                request, request_id, body, "stream: extraneous key [stream] is not permitted", dialect
            )
        messages = {key: value for key, value in body.items() if key != "anthropic_version"}
        messages["model"] = model
        if stream:
            messages["stream"] = True
        else:
            messages.pop("stream", None)
        rejection = self._api.invalid(request, request_id, messages, betas, dialect)
        if rejection is not None:
            return rejection
        return await self._api.answer(request, request_id, messages, dialect)

    def _refused(
        self,
        request: web.Request,
        request_id: str,
        body: Any,
        refusal: tuple[int, str, str],
        dialect: Dialect,
    ) -> web.Response:
        status, kind, message = refusal
        self._api.record_refusal(
            request, request_id, body, "unauthorized" if status in (401, 403) else "not_found"
        )
        return dialect.error(status, kind, message, request_id)


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
