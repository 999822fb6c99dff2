"""One JSON-RPC request to an exposed Agent: read, checked (version, caller, Agent), and answered, as one
JSON answer or, for SendStreamingMessage, as server-sent events until the task ends.

Every failure is a JSON-RPC error object naming what was wrong (the A2A and JSON-RPC codes), with an HTTP
status of its own only where A2A asks for one (401 without an accepted token, 403 where RBAC says no).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agentrun.a2a import protocol, protocol_v03, tasks
from agentrun.a2a.refusals import Refused, json_answer, refusal_of
from agentrun.a2a.task_handling import Caller, Target, parse_send
from agentrun.kube.errors import APIError

if TYPE_CHECKING:
    from agentrun.a2a.serving import A2AServer

logger = logging.getLogger(__name__)

SUPPORTED = (protocol.SEND, protocol.STREAM, protocol.GET_TASK, protocol.CANCEL_TASK)


async def dispatch(server: A2AServer, request: web.Request) -> web.StreamResponse:
    request_id: Any = None
    try:
        call = await _read(request)
        request_id = call.get("id")
        legacy = call["method"] in protocol_v03.METHODS  # A2A 0.3's names: answered in 0.3's shapes
        if not legacy:
            _check_version(request)
        caller = await server.caller(request)
        target = Target(request.match_info["namespace"], request.match_info["agent"])
        await server.exposed(target)
        method, params = call["method"], call.get("params") or {}
        if not isinstance(params, Mapping):
            raise protocol.RPCError(protocol.INVALID_PARAMS, "params must be an object")
        shape = _shape_v03 if legacy else dict
        if legacy:
            method, params = protocol_v03.METHODS[method], protocol_v03.params(method, params)
        if method == protocol.STREAM:
            return await _stream(server, request, request_id, target, caller, params, shape)
        answer = await _answer(server, request, method, params, target, caller)
        return json_answer(protocol.result(request_id, shape(answer)))
    except Refused as exc:
        return json_answer(exc.error.body(request_id), exc.status, exc.headers)
    except protocol.RPCError as exc:
        return json_answer(exc.body(request_id))
    except APIError as exc:
        refusal = refusal_of(exc)
        if isinstance(refusal, Refused):
            return json_answer(refusal.error.body(request_id), refusal.status)
        return json_answer(refusal.body(request_id))


async def _read(request: web.Request) -> dict[str, Any]:
    try:
        call = json.loads(await request.read())
    except ValueError:
        raise protocol.RPCError(protocol.PARSE_ERROR, "the body is not JSON") from None
    if not isinstance(call, dict) or call.get("jsonrpc") != "2.0" or not isinstance(call.get("method"), str):
        raise protocol.RPCError(
            protocol.INVALID_REQUEST, 'a JSON-RPC 2.0 request needs "jsonrpc": "2.0" and a method'
        )
    if call["method"] not in SUPPORTED and call["method"] not in protocol_v03.METHODS:
        served = ", ".join((*SUPPORTED, *protocol_v03.METHODS))
        raise protocol.RPCError(
            protocol.METHOD_NOT_FOUND, f"method {call['method']!r} is not served here (served: {served})"
        )
    return call


def _check_version(request: web.Request) -> None:
    """A2A 1.0 only; a request without the header is taken as 1.0 (curl, older clients of the same major)."""
    version = request.headers.get(protocol.VERSION_HEADER, protocol.PROTOCOL_VERSION).strip()
    if version.split(".")[0] != protocol.PROTOCOL_VERSION.split(".")[0]:
        raise protocol.RPCError(
            protocol.VERSION_NOT_SUPPORTED,
            f"A2A version {version!r} is not served here: this server speaks {protocol.PROTOCOL_VERSION}",
        )


def _task_id(params: Mapping[str, Any]) -> str:
    task_id = params.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise protocol.RPCError(protocol.INVALID_PARAMS, "params.id (the task id) is required")
    return task_id


async def _answer(
    server: A2AServer,
    request: web.Request,
    method: str,
    params: Mapping[str, Any],
    target: Target,
    caller: Caller,
) -> dict[str, Any]:
    wait = server.config.wait_seconds
    if method == protocol.SEND:
        sent = parse_send(params)
        run = await server.handler.create(target, caller, sent)
        logger.info(
            "task %s/%s sent to %s by %s",
            target.namespace,
            run["metadata"]["name"],
            target.agent,
            caller.username,
        )
        if not sent.return_immediately:
            gone = _gone(request)
            run = await server.handler.settled(target, caller, run["metadata"]["name"], wait, gone) or run
        return {"task": tasks.task(run)}
    if method == protocol.GET_TASK:
        return tasks.task(await server.handler.read(target, caller, _task_id(params)))
    run = await server.handler.cancel(target, caller, _task_id(params), min(wait, 30.0))
    return tasks.task(run)


def _shape_v03(answer: Mapping[str, Any]) -> dict[str, Any]:
    return protocol_v03.result(answer)


def _gone(request: web.Request) -> Callable[[], bool]:
    """Whether the caller closed its connection: a blocking send stops reading the run for nobody."""
    return lambda: request.transport is None or request.transport.is_closing()


async def _stream(
    server: A2AServer,
    request: web.Request,
    request_id: Any,
    target: Target,
    caller: Caller,
    params: Mapping[str, Any],
    shape: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> web.StreamResponse:
    """The task, then each change of its status, its answer and its final status, as server-sent events."""
    sent = parse_send(params)
    created = await server.handler.create(target, caller, sent)
    name = created["metadata"]["name"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)

    async def event(result: Mapping[str, Any]) -> None:
        await response.write(f"data: {json.dumps(protocol.result(request_id, shape(result)))}\n\n".encode())

    try:
        await event({"task": tasks.task(created)})
        await _follow(server, target, caller, created, event)
    except (protocol.RPCError, APIError) as exc:
        error = (
            exc
            if isinstance(exc, protocol.RPCError)
            else protocol.RPCError(protocol.INTERNAL_ERROR, str(exc))
        )
        await response.write(f"event: error\ndata: {json.dumps(error.body(request_id))}\n\n".encode())
    except ConnectionResetError:  # the caller left: the task goes on (GetTask reads it), the stream ends
        logger.info("stream of task %s/%s closed by its caller", target.namespace, name)
        return response
    await response.write_eof()
    return response


async def _follow(
    server: A2AServer,
    target: Target,
    caller: Caller,
    created: Mapping[str, Any],
    event: Callable[[Mapping[str, Any]], Awaitable[None]],
) -> None:
    """Each change of the task after the first event: the result artifact, then the new status."""
    first = True
    name = created["metadata"]["name"]
    async for run in server.handler.follow(target, caller, name, server.config.wait_seconds):
        if first and tasks.task_status(run) == tasks.task_status(created):
            first = False
            continue
        first = False
        artifact = tasks.result_artifact(run)
        if artifact is not None:
            await event(tasks.artifact_update(run, artifact))
        await event(tasks.status_update(run))
