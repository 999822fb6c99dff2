"""Tools read whole answers up to their cap, however the server splits them into chunks."""

from __future__ import annotations

import aiohttp
import pytest

from agentrun.tools.body_reading import read_capped
from tests.unit.tools.servers import serving_in_chunks

BODY = bytes(range(256)) * 40  # 10 KiB, sent in 1 KiB chunks with pauses between them


@pytest.mark.parametrize(
    ("limit", "expected"), [(len(BODY) + 1, BODY), (len(BODY), BODY), (3000, BODY[:3000])]
)
async def test_a_body_sent_in_chunks_is_read_whole_up_to_the_cap(limit: int, expected: bytes) -> None:
    async with (
        serving_in_chunks("/", BODY) as url,
        aiohttp.ClientSession() as session,
        session.get(url) as response,
    ):
        assert await read_capped(response.content, limit) == expected
