"""Who the console asks the API server as: the person, never the console itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: kubeconfig: the person runs the console with their own kubeconfig (local use); token: each person
#: signs in with their own bearer token; proxy: an authenticating proxy (oauth2-proxy) asserts who they
#: are and the console impersonates them.
AuthMode = Literal["kubeconfig", "token", "proxy"]
AUTH_MODES: tuple[AuthMode, ...] = ("kubeconfig", "token", "proxy")


@dataclass(frozen=True)
class Identity:
    """A person as the API server will see them.

    ``bearer``: their own token, sent instead of any credential of the console's. ``user`` (and
    ``groups``): asserted by an authenticating proxy; the console's own credentials go with
    ``Impersonate-User``/``Impersonate-Group``, so the server checks both that the console may
    impersonate and what the person may do. Neither: the kubeconfig's own identity (local use, where
    the person running the console is the one looking).
    """

    label: str
    bearer: str | None = None
    user: str | None = None
    groups: tuple[str, ...] = ()

    def __repr__(self) -> str:  # never a token in a log line or a traceback
        return f"Identity(label={self.label!r}, user={self.user!r}, groups={self.groups!r})"

    def headers(self, own_authorization: str | None) -> list[tuple[str, str]]:
        if self.bearer is not None:
            return [("Authorization", f"Bearer {self.bearer}")]
        headers = [("Authorization", own_authorization)] if own_authorization else []
        if self.user is not None:
            headers.append(("Impersonate-User", self.user))
            headers.extend(("Impersonate-Group", group) for group in self.groups)
        return headers
