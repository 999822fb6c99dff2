"""Reading a bounded HTTP answer body, for every tool that calls a server over aiohttp."""

from __future__ import annotations

import aiohttp


async def read_capped(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """Up to ``limit`` bytes of the body, or all of it when shorter.

    Why not ``stream.read(limit)``: it returns whatever has arrived so far, so a body sent in several
    chunks (a real API server's discovery answers, a slow webhook) came back cut short at random.
    """
    raw = bytearray()
    while len(raw) < limit:
        chunk = await stream.read(limit - len(raw))
        if not chunk:
            break
        raw += chunk
    return bytes(raw)
