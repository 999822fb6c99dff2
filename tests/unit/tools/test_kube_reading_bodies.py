"""The Kubernetes reader takes whole answers, however the server splits them into chunks.

A real kube-apiserver streams larger answers (``/api/v1`` discovery) in several chunks; reading
only what had arrived first made the tools report "non-JSON" now and then.
"""

from __future__ import annotations

import json

from agentrun.tools.environment import KubeConnection
from agentrun.tools.kube_reading import KubeReader
from tests.unit.tools.servers import serving_in_chunks


async def _none() -> str | None:
    return None


async def test_an_answer_that_arrives_in_several_chunks_is_read_whole() -> None:
    listing = {
        "kind": "APIResourceList",
        "resources": [{"name": f"r{i}", "namespaced": True} for i in range(200)],
    }
    async with serving_in_chunks("/api/v1", json.dumps(listing).encode(), chunk=1000) as url:
        reader = KubeReader(KubeConnection(url, None, _none), user="system:serviceaccount:a:b")
        try:
            assert await reader.get_json("/api/v1", action="discover v1") == listing
        finally:
            await reader.close()
