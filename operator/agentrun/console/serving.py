"""The console's HTTP server: who is asking (sessions, sign-in, the proxy's word), the guard every
request passes (CSRF, Host, security headers), static assets, and the routes of the pages
(run_serving.py) and live streams (live_streaming.py)."""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agentrun.console import views
from agentrun.console.api_calling import ClusterAPI
from agentrun.console.identities import AuthMode, Identity
from agentrun.console.sessions import COOKIE, Session, Sessions
from agentrun.kube.errors import APIError, APIStatusError, APIUnauthorizedError
from agentrun.kube.kubeconfig_loading import ClusterAccess
from agentrun.stores.postgres import TranscriptDatabase

logger = logging.getLogger(__name__)

SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SELF_SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
STATIC = {"console.css": "text/css", "console.js": "text/javascript"}
#: Paths open without a session: signing in, the assets, the probe.
OPEN = ("/login", "/static/", "/healthz")
SECURITY_HEADERS = {
    # Every asset is the console's own: no CDN, no inline script, no framing.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer browsers send "Origin: null" on form posts.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SESSION = web.RequestKey("session", Session)


@dataclass(frozen=True)
class ConsoleConfig:
    auth: AuthMode
    #: Cookies only over HTTPS: on unless the console is reached over plain HTTP on this machine.
    secure_cookies: bool = True
    #: kubeconfig mode: the Host header must name one of these (a DNS-rebinding page cannot use it).
    allowed_hosts: tuple[str, ...] = ()
    #: proxy mode: the headers the authenticating proxy sets (oauth2-proxy's by default).
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"
    #: The namespace the runs page opens on ("" for all namespaces).
    namespace: str = ""
    page_size: int = 50
    #: The PostgreSQL transcript store's DSN: transcripts kept there are shown to whoever may list the
    #: run's namespace's Secrets (the right that reads transcripts kept in Secrets).
    database_url: str | None = field(default=None, repr=False)


async def may(api: ClusterAPI, identity: Identity, verb: str, resource: str, namespace: str) -> bool:
    """Whether the API server lets this identity ``verb`` ``resource`` in ``namespace`` (a
    SelfSubjectAccessReview, as `kubectl auth can-i`)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource}},
    }
    answer = await api.request(identity, "POST", SELF_SUBJECT_ACCESS_REVIEWS, body=review)
    return bool((answer.get("status") or {}).get("allowed"))


async def who_is(api: ClusterAPI, identity: Identity) -> str | None:
    """The user name the API server gives this identity (a SelfSubjectReview, as `kubectl auth whoami`)."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = await api.request(identity, "POST", SELF_SUBJECT_REVIEWS, body=review)
    name = ((answer.get("status") or {}).get("userInfo") or {}).get("username")
    return str(name) if name else None


class Console:
    @classmethod
    def of(cls, access: ClusterAccess, config: ConsoleConfig) -> Console:
        """The console for a cluster; its own credentials go out in kubeconfig and proxy modes only."""
        return cls(ClusterAPI(access, own_credentials=config.auth != "token"), config)

    def __init__(self, api: ClusterAPI, config: ConsoleConfig, sessions: Sessions | None = None) -> None:
        self.api = api
        self.config = config
        self.sessions = sessions or Sessions()
        self._local: Identity | None = None
        self._database: TranscriptDatabase | None = None

    async def database(self) -> TranscriptDatabase | None:
        """The transcript store's database, connected on first use (None without a DSN)."""
        if self._database is None and self.config.database_url:
            self._database = await TranscriptDatabase.connect(self.config.database_url, max_size=4)
        return self._database

    def app(self) -> web.Application:
        from agentrun.console import live_streaming, resource_serving, run_serving

        app = web.Application(middlewares=[self._guard], client_max_size=64 * 1024)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/login", self._login_page)
        app.router.add_post("/login", self._login)
        app.router.add_post("/logout", self._logout)
        run_serving.add_routes(app, self)
        resource_serving.add_routes(app, self)
        live_streaming.add_routes(app, self)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _: web.Application) -> None:
        await self.api.close()
        if self._database is not None:
            await self._database.close()

    # Who is asking ---------------------------------------------------------------------------------

    async def _session(self, request: web.Request) -> Session | None:
        found = self.sessions.find(request.cookies.get(COOKIE))
        if self.config.auth == "token":
            return found
        if self.config.auth == "proxy":
            user = request.headers.get(self.config.user_header)
            if not user:
                return None
            groups = tuple(
                g.strip() for g in request.headers.get(self.config.groups_header, "").split(",") if g.strip()
            )
            if found is not None and (found.identity.user, found.identity.groups) == (user, groups):
                return found
            return self.sessions.create(Identity(user, user=user, groups=groups))
        if found is not None:
            return found
        if self._local is None:
            self._local = Identity(await who_is(self.api, Identity("you")) or "you (kubeconfig)")
        return self.sessions.create(self._local)

    def set_cookie(self, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(
            COOKIE,
            session.id,
            httponly=True,
            secure=self.config.secure_cookies,
            samesite="Strict",
            path="/",
        )

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await self._guarded(request, handler)
        except web.HTTPException as exc:  # aiohttp's own (a route not found, a method not allowed)
            response = web.Response(status=exc.status, headers=exc.headers, text=exc.text)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.config.allowed_hosts and request.host.rsplit(":", 1)[0] not in self.config.allowed_hosts:
            return self.problem(400, f"this console answers to {', '.join(self.config.allowed_hosts)} only")
        origin = request.headers.get("Origin")
        if request.method == "POST" and origin is not None and origin.split("://", 1)[-1] != request.host:
            return self.problem(403, "a form posted from another site is refused")
        if request.path.startswith(OPEN):
            return await handler(request)
        try:
            session = await self._session(request)
        except APIError as exc:
            return self.problem(502, f"the API server cannot tell who you are: {exc}")
        if session is None:
            if self.config.auth == "proxy":
                return self.problem(
                    401, f"no {self.config.user_header} header: reach the console through its proxy"
                )
            if request.method == "GET" and not request.path.startswith("/live/"):
                return see_other("/login")
            return self.problem(401, "sign in first")
        if request.method == "POST":
            form = await request.post()
            sent = form.get("csrf")
            if not session.csrf_ok(sent if isinstance(sent, str) else None):
                return self.problem(
                    403, "the form's token is missing or stale: reload the page and try again", session
                )
        request[SESSION] = session
        response = await handler(request)
        if request.cookies.get(COOKIE) != session.id:
            self.set_cookie(response, session)
        return response

    def problem(self, status: int, message: str, session: Session | None = None) -> web.Response:
        who, csrf = (session.identity.label, session.csrf) if session is not None else (None, None)
        return web.Response(
            status=status, text=views.problem(status, message, who=who, csrf=csrf), content_type="text/html"
        )

    def api_problem(self, exc: APIError, what: str, session: Session) -> web.Response:
        """The API server's refusal shown as it words it: RBAC decides, the console only relays."""
        status = exc.status if isinstance(exc, APIStatusError) and exc.status else 502
        if isinstance(exc, APIUnauthorizedError) and self.config.auth == "token":
            self.sessions.drop(session.id)
            return self.problem(401, "the API server no longer accepts your token: sign in again")
        return self.problem(status if status < 500 else 502, f"{what}: {exc}", session)

    # Open routes -----------------------------------------------------------------------------------

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        body = importlib.resources.files("agentrun.console.static").joinpath(name).read_bytes()
        return web.Response(body=body, content_type=STATIC[name], headers={"Cache-Control": "max-age=300"})

    async def _login_page(self, _: web.Request) -> web.Response:
        if self.config.auth != "token":
            return see_other("/")
        return web.Response(text=views.login(), content_type="text/html")

    async def _login(self, request: web.Request) -> web.StreamResponse:
        if self.config.auth != "token":
            return see_other("/")
        form = await request.post()
        token = str(form.get("token") or "").strip()
        if not token:
            return web.Response(status=400, text=views.login("paste a token"), content_type="text/html")
        try:
            name = await who_is(self.api, Identity("?", bearer=token))
        except APIStatusError as exc:
            message = "the API server does not accept this token" if exc.status == 401 else str(exc)
            return web.Response(status=401, text=views.login(message), content_type="text/html")
        except APIError as exc:
            return web.Response(
                status=502,
                text=views.login(f"the API server cannot be reached: {exc}"),
                content_type="text/html",
            )
        session = self.sessions.create(Identity(name or "(unnamed)", bearer=token))
        logger.info("signed in: %s", session.identity.label)
        response = see_other("/")
        self.set_cookie(response, session)
        return response

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        self.sessions.drop(request.cookies.get(COOKIE))
        response = see_other("/login" if self.config.auth == "token" else "/")
        response.del_cookie(COOKIE, path="/")
        return response


@contextlib.asynccontextmanager
async def serving(
    console: Console, host: str, port: int, *, any_port_if_taken: bool = False
) -> AsyncIterator[int]:
    """The console served on ``host``:``port`` (0: a free port; with ``any_port_if_taken`` a free one when
    ``port`` is taken) until the block ends; yields the port it listens on."""
    runner = web.AppRunner(console.app(), access_log=None)
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError:
            if not any_port_if_taken:
                raise
            await web.TCPSite(runner, host, 0).start()
        yield next(address[1] for address in runner.addresses if isinstance(address, tuple))
    finally:
        await runner.cleanup()


def see_other(location: str) -> web.Response:
    """A redirect after a form (303), returned like any response so the guard adds its headers."""
    return web.Response(status=303, headers={"Location": location})


def session_of(request: web.Request) -> Session:
    return request[SESSION]


def form_value(form: Any, key: str) -> str:
    value = form.get(key)
    return value.strip() if isinstance(value, str) else ""
