"""Which replica owns which run: pure functions of the live members' names and the run's uid.

Why rendezvous hashing: every replica computes the same owner from the same view without talking to
the others, and when a member joins or leaves only the runs it gains or loses move (about 1/N of them),
unlike ``hash(uid) % N``, which moves nearly all. No virtual nodes are needed for an even spread.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

__all__ = ["lease_name", "owner", "view_id"]

#: Longest Lease name we make: a DNS label, so it is valid wherever a name of any kind is.
MAX_NAME = 63
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def view_id(members: Iterable[str]) -> str:
    """The id every replica derives from the same set of live members (order does not matter)."""
    return hashlib.sha256("\n".join(sorted(members)).encode()).hexdigest()[:12]


def _score(member: str, uid: str) -> bytes:
    return hashlib.sha256(f"{member}/{uid}".encode()).digest()


def owner(uid: str, members: Sequence[str]) -> str | None:
    """The member with the largest sha256 of "<member>/<uid>"; None when there are no members."""
    if not members:
        return None
    return max(members, key=lambda member: (_score(member, uid), member))


def lease_name(group: str, replica: str) -> str:
    """``agentrun-<group>-<replica>``, made DNS-safe; a long or unsafe name is cut and gets a hash suffix
    so two replicas never share a Lease."""
    wanted = f"agentrun-{group}-{replica}"
    safe = _NOT_DNS.sub("-", wanted.lower()).strip("-")
    if safe == wanted and len(safe) <= MAX_NAME:
        return wanted
    suffix = hashlib.sha256(wanted.encode()).hexdigest()[:10]
    return f"{safe[: MAX_NAME - len(suffix) - 1].rstrip('-')}-{suffix}"
