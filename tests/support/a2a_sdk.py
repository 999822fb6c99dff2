"""a2a-sdk's own A2A server (its JSON-RPC routes and request handler, served by uvicorn on 127.0.0.1),
with an agent whose behaviour the message picks, to prove the operator's A2A client against the SDK.

What the agent does with a message's text:
* contains "fail": the task fails, with a status message;
* contains "question": the task asks for input (input-required);
* contains "slow": the task works until it is canceled (30 s at most);
* otherwise it completes with one artifact, "echo: <text>".
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import uvicorn
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Role
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send


@dataclass
class Echo(AgentExecutor):
    """Records what it was sent (message ids, texts) and which tasks were canceled."""

    message_ids: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    canceled: list[str] = field(default_factory=list)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        self.message_ids.append(message.message_id)
        text = context.get_user_input()
        self.texts.append(text)
        task = context.current_task or new_task_from_user_message(message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        if "fail" in text:
            await updater.failed(new_text_message("the echo agent cannot do that", role=Role.ROLE_AGENT))
        elif "question" in text:
            await updater.requires_input(new_text_message("which cluster do you mean?", role=Role.ROLE_AGENT))
        elif "slow" in text:
            await asyncio.sleep(30)  # bounded: a test that forgets to cancel still ends
        else:
            await updater.add_artifact([new_text_part(f"echo: {text}")], name="answer", last_chunk=True)
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        self.canceled.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def echo_card(url: str) -> AgentCard:
    return AgentCard(
        name="echo",
        description="Repeats what it is told.",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="repeat",
                name="Repeat",
                description="Says the message back.",
                tags=["echo"],
                examples=["say hello"],
            )
        ],
    )


class HeaderRecorder:
    """ASGI middleware keeping every request's headers (to check headersFrom reached the server)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.headers.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


@dataclass
class SDKAgent:
    url: str
    agent: Echo
    recorder: HeaderRecorder


@contextlib.asynccontextmanager
async def sdk_agent_serving() -> AsyncIterator[SDKAgent]:
    """The SDK's server for the echo agent at ``http://127.0.0.1:PORT/`` (its card at the well-known path)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = echo_card(url + "/")
    agent = Echo()
    handler = DefaultRequestHandler(agent_executor=agent, task_store=InMemoryTaskStore(), agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/")])
    recorder = HeaderRecorder(app)
    server = uvicorn.Server(
        uvicorn.Config(recorder, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield SDKAgent(url, agent, recorder)
    finally:
        server.should_exit = True
        await task
        sock.close()
