"""A2A tasks as AgentRuns, every request made as the caller: sending creates the run, getting reads it,
canceling sets spec.cancel (what `kubectl agentrun cancel` does), and each waits by reading the run again.

Nothing here uses the server's own rights: the caller's token goes to the API server with each request, so
RBAC on agentruns decides who may send, read and cancel, and AgentRunQuotas admit the run like any other.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.a2a import protocol, tasks
from agentrun.console.api_calling import ClusterAPI
from agentrun.console.identities import Identity
from agentrun.kube.errors import APIAlreadyExistsError, APINotFoundError

RUNS = "/apis/agentrun.dev/v1alpha1/namespaces/{namespace}/agentruns"
MERGE_PATCH = "application/merge-patch+json"
Sleep = Callable[[float], Awaitable[None]]
#: Whether the caller has left (its connection closed): a wait for it ends.
Gone = Callable[[], bool]


def never() -> bool:
    return False


@dataclass(frozen=True)
class Caller:
    """Who sent the request: the API server's name for them and the identity their requests go as."""

    username: str
    identity: Identity


@dataclass(frozen=True)
class Target:
    """The exposed Agent a request is addressed to."""

    namespace: str
    agent: str


@dataclass(frozen=True)
class Sent:
    """A message's task as the request asked for it."""

    text: str
    message_id: str
    context_id: str
    return_immediately: bool


def parse_send(params: Mapping[str, Any]) -> Sent:
    """The task a SendMessage asks for; a message the run cannot take raises RPCError (invalid params)."""
    message = params.get("message")
    if not isinstance(message, Mapping):
        raise protocol.RPCError(protocol.INVALID_PARAMS, "params.message is required")
    if message.get("taskId"):
        raise protocol.RPCError(
            protocol.UNSUPPORTED_OPERATION,
            "a task of this agent takes no further message once sent: send a new message without taskId",
        )
    message_id = message.get("messageId")
    if not isinstance(message_id, str) or not message_id:
        raise protocol.RPCError(protocol.INVALID_PARAMS, "params.message.messageId is required")
    given = message.get("parts")
    parts: list[Any] = given if isinstance(given, list) else []
    if any(isinstance(p, Mapping) and ("url" in p or "raw" in p) for p in parts):
        raise protocol.RPCError(
            protocol.CONTENT_TYPE_NOT_SUPPORTED, "file parts are not taken here: send the task as text"
        )
    text = protocol.text_of(parts)
    if not text.strip():
        raise protocol.RPCError(
            protocol.CONTENT_TYPE_NOT_SUPPORTED, "the message has no text: send the task as a text part"
        )
    configuration = params.get("configuration")
    immediately = isinstance(configuration, Mapping) and configuration.get("returnImmediately") is True
    context = message.get("contextId")
    return Sent(
        text, message_id, context if isinstance(context, str) and context else str(uuid.uuid4()), immediately
    )


def run_name(target: Target, caller: Caller, message_id: str) -> str:
    """The same for a retried message: a send that is repeated finds the run it made the first time."""
    digest = hashlib.sha256(f"{target.namespace}\0{target.agent}\0{caller.username}\0{message_id}".encode())
    return f"{target.agent[:40]}-a2a-{digest.hexdigest()[:12]}"


class TaskHandler:
    def __init__(self, api: ClusterAPI, *, poll_seconds: float, sleep: Sleep = asyncio.sleep) -> None:
        self._api = api
        self._poll = poll_seconds
        self._sleep = sleep

    async def create(self, target: Target, caller: Caller, sent: Sent) -> dict[str, Any]:
        """The task's run, created as the caller (or found, when the same message was sent before)."""
        name = run_name(target, caller, sent.message_id)
        manifest = tasks.run_manifest(
            name,
            target.namespace,
            target.agent,
            sent.text,
            context_id=sent.context_id,
            caller=caller.username,
        )
        path = RUNS.format(namespace=target.namespace)
        try:
            return await self._api.request(caller.identity, "POST", path, body=manifest)
        except APIAlreadyExistsError:
            run = await self._api.request(caller.identity, "GET", f"{path}/{name}")
            annotations = (run.get("metadata") or {}).get("annotations") or {}
            if annotations.get(tasks.CALLER_ANNOTATION) != caller.username or not tasks.of_agent(
                run, target.agent
            ):
                raise protocol.RPCError(
                    protocol.INVALID_REQUEST, "this messageId was used for another task"
                ) from None
            return run

    async def read(self, target: Target, caller: Caller, task_id: str) -> dict[str, Any]:
        """The task's run as the caller may read it; TaskNotFound when it is no task of this Agent."""
        path = f"{RUNS.format(namespace=target.namespace)}/{task_id}"
        try:
            run = await self._api.request(caller.identity, "GET", path)
        except APINotFoundError:
            run = {}
        if not tasks.of_agent(run, target.agent):
            raise protocol.RPCError(protocol.TASK_NOT_FOUND, f"no task {task_id!r} of agent {target.agent}")
        return run

    async def cancel(
        self, target: Target, caller: Caller, task_id: str, wait_seconds: float
    ) -> dict[str, Any]:
        """spec.cancel set as the caller (RBAC: patch on agentruns); the run as it is once Cancelled or
        after ``wait_seconds``."""
        run = await self.read(target, caller, task_id)
        if tasks.state(run) in protocol.TERMINAL:
            raise protocol.RPCError(
                protocol.TASK_NOT_CANCELABLE, f"task {task_id!r} has ended ({tasks.state(run)})"
            )
        path = f"{RUNS.format(namespace=target.namespace)}/{task_id}"
        body = {"spec": {"cancel": True}}
        await self._api.request(caller.identity, "PATCH", path, body=body, content_type=MERGE_PATCH)
        return await self.settled(target, caller, task_id, wait_seconds) or run

    async def settled(
        self, target: Target, caller: Caller, task_id: str, wait_seconds: float, gone: Gone = never
    ) -> dict[str, Any] | None:
        """The run once its task ended or was interrupted, or as it is after ``wait_seconds``."""
        last: dict[str, Any] | None = None
        async for run in self.follow(target, caller, task_id, wait_seconds, gone):
            last = run
        return last

    async def follow(
        self, target: Target, caller: Caller, task_id: str, wait_seconds: float, gone: Gone = never
    ) -> AsyncIterator[dict[str, Any]]:
        """The run each time its task's state or message changes, until the task ends or an interrupted
        state comes, or ``wait_seconds`` pass, or ``gone()`` says the caller left (nobody would read
        another answer: the task goes on, and GetTask reads it)."""
        deadline = time.monotonic() + wait_seconds
        seen: tuple[str, str] | None = None
        while True:
            run = await self.read(target, caller, task_id)
            shown = tasks.task_status(run)
            key = (shown["state"], protocol.text_of((shown.get("message") or {}).get("parts")))
            if key != seen:
                seen = key
                yield run
            if shown["state"] in protocol.TERMINAL or shown["state"] in protocol.INTERRUPTED:
                return
            if time.monotonic() >= deadline or gone():
                return
            await self._sleep(min(self._poll, max(0.0, deadline - time.monotonic())))
