"""`agentrun a2a`'s HTTP server: each exposed Agent's Agent Card, and its JSON-RPC endpoint, where the
caller's bearer token is reviewed by the API server (a SelfSubjectReview made with that token) and every
task request then goes to the API server with it (task_handling.py).

The server's own credentials read Agents only, to publish the cards of those with spec.a2a.expose: a
card is public by design, and holds nothing but what spec.a2a says.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentrun.a2a import cards, protocol
from agentrun.a2a.refusals import Refused
from agentrun.a2a.task_handling import Caller, Target, TaskHandler
from agentrun.api.a2a_spec import A2AExposure
from agentrun.console.api_calling import ClusterAPI
from agentrun.console.identities import Identity
from agentrun.console.serving import who_is
from agentrun.kube.errors import APIError, APINotFoundError, APIUnauthorizedError
from agentrun.kube.kubeconfig_loading import ClusterAccess

logger = logging.getLogger(__name__)

AGENTS = "/apis/agentrun.dev/v1alpha1/namespaces/{namespace}/agents/{name}"
BASE = "/agents/{namespace}/{agent}"
OWN = Identity("agentrun a2a")
MAX_BODY_BYTES = 1_048_576


@dataclass(frozen=True)
class A2AConfig:
    #: Only Agents of these namespaces are served (empty: every namespace the server may read Agents in).
    namespaces: tuple[str, ...] = ()
    #: The URL callers reach this server at (behind an Ingress); else the request's own scheme and host.
    public_url: str | None = None
    #: How long a blocking SendMessage waits for its run to end before answering with the task as it is.
    wait_seconds: float = 600.0
    #: How often a waiting request reads its run again.
    poll_seconds: float = 1.0


class A2AServer:
    @classmethod
    def of(cls, access: ClusterAccess, config: A2AConfig) -> A2AServer:
        """Two clients: the server's own (Agents, for cards) and the callers' (their tokens only)."""
        return cls(
            ClusterAPI(access, own_credentials=True), ClusterAPI(access, own_credentials=False), config
        )

    def __init__(self, own: ClusterAPI, callers: ClusterAPI, config: A2AConfig) -> None:
        self.own, self.callers, self.config = own, callers, config
        self.handler = TaskHandler(callers, poll_seconds=config.poll_seconds)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get(BASE + protocol.CARD_PATH, self._card)
        app.router.add_post(BASE, self._rpc)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _: web.Application) -> None:
        await self.own.close()
        await self.callers.close()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    def base_url(self, request: web.Request) -> str:
        path = BASE.format(**request.match_info)
        root = (
            self.config.public_url.rstrip("/")
            if self.config.public_url
            else f"{request.scheme}://{request.host}"
        )
        return root + path

    async def exposed(self, target: Target) -> tuple[dict[str, Any], A2AExposure]:
        """The Agent and its spec.a2a, read with the server's own rights; 404 unless it is exposed."""
        missing = Refused(
            404,
            protocol.RPCError(
                protocol.INVALID_REQUEST, f"no agent {target.namespace}/{target.agent} is exposed here"
            ),
        )
        if self.config.namespaces and target.namespace not in self.config.namespaces:
            raise missing
        try:
            agent = await self.own.request(
                OWN, "GET", AGENTS.format(namespace=target.namespace, name=target.agent)
            )
        except APINotFoundError:
            raise missing from None
        exposure = cards.exposure(agent)
        if exposure is None:
            raise missing
        return agent, exposure

    async def _card(self, request: web.Request) -> web.Response:
        target = Target(request.match_info["namespace"], request.match_info["agent"])
        try:
            agent, exposure = await self.exposed(target)
        except Refused as exc:
            return web.json_response({"error": exc.error.message}, status=exc.status)
        except APIError as exc:
            return web.json_response({"error": f"the Agent cannot be read: {exc}"}, status=502)
        return web.json_response(cards.card(agent, exposure, self.base_url(request)))

    async def caller(self, request: web.Request) -> Caller:
        """Who the bearer token is, as the API server says (a SelfSubjectReview made with the token)."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        challenge = {"WWW-Authenticate": 'Bearer realm="kubernetes"'}
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(
                401, protocol.RPCError(protocol.INVALID_REQUEST, "send a Kubernetes bearer token"), challenge
            )
        identity = Identity("?", bearer=token.strip())
        try:
            name = await who_is(self.callers, identity)
        except APIUnauthorizedError:
            raise Refused(
                401,
                protocol.RPCError(protocol.INVALID_REQUEST, "the API server does not accept this token"),
                challenge,
            ) from None
        if not name:
            raise Refused(
                401, protocol.RPCError(protocol.INVALID_REQUEST, "the API server names nobody for this token")
            )
        return Caller(name, Identity(name, bearer=token.strip()))

    async def _rpc(self, request: web.Request) -> web.StreamResponse:
        from agentrun.a2a import rpc_dispatching  # it calls back into this server

        return await rpc_dispatching.dispatch(self, request)


@contextlib.asynccontextmanager
async def serving(server: A2AServer, host: str, port: int) -> AsyncIterator[int]:
    """The server on ``host``:``port`` (0: a free one) until the block ends; yields the port."""
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        yield next(address[1] for address in runner.addresses if isinstance(address, tuple))
    finally:
        await runner.cleanup()
