"""Browser sessions: which person a cookie stands for, and the token each form must carry (CSRF).

Kept in the console's memory only: a restart signs everyone out, and a person's token never leaves this
process (not in a cookie, a URL or a log line). The cookie holds a random session id, HttpOnly and
SameSite=Strict, Secure when the console is reached over HTTPS (or told it is, behind a proxy).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agentrun.console.identities import Identity

COOKIE = "agentrun_console"
#: A session unused this long is forgotten (signed out).
IDLE_SECONDS = 8 * 3600.0
#: Sessions kept at most: the oldest go first (a flood of sign-ins cannot fill the memory).
MAX_SESSIONS = 10_000


@dataclass
class Session:
    id: str
    identity: Identity
    csrf: str
    last_used: float = field(default=0.0)

    def csrf_ok(self, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(sent.encode(), self.csrf.encode())


class Sessions:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_id: dict[str, Session] = {}

    def create(self, identity: Identity) -> Session:
        while len(self._by_id) >= MAX_SESSIONS:
            del self._by_id[next(iter(self._by_id))]
        session = Session(secrets.token_urlsafe(32), identity, secrets.token_urlsafe(32), self._clock())
        self._by_id[session.id] = session
        return session

    def find(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_used > IDLE_SECONDS:
            del self._by_id[session_id]
            return None
        session.last_used = now
        return session

    def drop(self, session_id: str | None) -> None:
        if session_id:
            self._by_id.pop(session_id, None)
