"""`http_fetch` against a real aiohttp server on 127.0.0.1: what is fetched and what is refused."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest

from agentrun.api.spec import AgentRunSpec
from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall
from agentrun.tools.errors import InvalidToolSpec
from agentrun.tools.registry import check_tools, open_tools
from tests.unit.tools.environment import StaticEnvironment


class Site:
    def __init__(self) -> None:
        self.hits: list[str] = []
        self.url = ""

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        self.hits.append(request.path)
        if request.path == "/hop":
            raise aiohttp.web.HTTPFound("/docs")
        if request.path == "/away":
            raise aiohttp.web.HTTPFound("http://169.254.169.254/latest/meta-data/")
        if request.path == "/big":
            return aiohttp.web.Response(text="x" * 5000)
        if request.path == "/image":
            return aiohttp.web.Response(body=b"\x89PNG", content_type="image/png")
        return aiohttp.web.Response(text="release notes: v2 is out")


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    target = Site()
    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", target.handle)
    runner = aiohttp.web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    tcp = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = runner.addresses[0][1]
    target.url = f"http://127.0.0.1:{port}"
    try:
        yield target
    finally:
        await runner.cleanup()


def _spec(config: dict[str, Any]) -> AgentRunSpec:
    return AgentRunSpec.model_validate(
        {"task": "t", "tools": [{"builtin": {"name": "http_fetch", "config": config}}]}
    )


async def _fetch(config: dict[str, Any], url: str) -> dict[str, Any]:
    async with open_tools(_spec(config), StaticEnvironment()) as tools:
        output = await tools["http_fetch"].call(ToolCall("toolu_1", "http_fetch", {"url": url}, "k", 1))
    result: dict[str, Any] = json.loads(output.content)
    return result


async def _refusal(config: dict[str, Any], url: str) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await _fetch(config, url)
    return caught.value


async def test_loopback_is_refused_by_default_even_when_the_host_is_allowlisted(site: Site) -> None:
    error = await _refusal({"allowedHosts": ["127.0.0.1"]}, f"{site.url}/docs")
    assert error.code == "address_refused" and "loopback" in error.message
    assert site.hits == []


async def test_a_name_resolving_to_loopback_is_refused_after_resolution(site: Site) -> None:
    port = site.url.rsplit(":", 1)[1]
    error = await _refusal({"allowedHosts": ["localhost"]}, f"http://localhost:{port}/docs")
    assert error.code == "address_refused" and "localhost resolves to" in error.message
    assert site.hits == []


async def test_ipv6_loopback_is_refused() -> None:
    error = await _refusal({"allowedHosts": ["::1"]}, "http://[::1]:9/")
    assert error.code == "address_refused"


async def test_loopback_is_fetched_when_the_config_opts_in(site: Site) -> None:
    result = await _fetch({"allowedHosts": ["127.0.0.1"], "allowLoopback": True}, f"{site.url}/docs")
    assert result["status"] == 200
    assert result["body"] == "release notes: v2 is out"
    assert result["truncated"] is False


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://metadata.google.internal/",
    ],
)
async def test_cloud_metadata_is_refused_even_with_link_local_allowed(url: str) -> None:
    host = url.split("/")[2].strip("[]").rsplit("]", 1)[0]
    config = {"allowedHosts": [host, "fd00:ec2::254"], "allowLinkLocal": True}
    error = await _refusal(config, url)
    assert error.code == "address_refused" and "metadata" in error.message


async def test_link_local_is_refused_by_default() -> None:
    error = await _refusal({"allowedHosts": ["169.254.10.1"]}, "http://169.254.10.1/")
    assert error.code == "address_refused" and "link-local" in error.message


async def test_a_host_off_the_allowlist_is_refused_with_the_allowlist_as_hint(site: Site) -> None:
    error = await _refusal({"allowedHosts": ["docs.example.com"], "allowLoopback": True}, f"{site.url}/")
    assert error.code == "host_not_allowed" and error.hint == "allowed hosts: docs.example.com"
    assert site.hits == []


async def test_wildcard_hosts_match_subdomains_only() -> None:
    error = await _refusal({"allowedHosts": ["*.example.com"]}, "http://example.com.evil.test/")
    assert error.code == "host_not_allowed"


async def test_bodies_are_cut_at_max_bytes(site: Site) -> None:
    config = {"allowedHosts": ["127.0.0.1"], "allowLoopback": True, "maxBytes": 100}
    result = await _fetch(config, f"{site.url}/big")
    assert result["truncated"] is True and result["body"] == "x" * 100


async def test_non_text_bodies_are_not_shown(site: Site) -> None:
    result = await _fetch({"allowedHosts": ["127.0.0.1"], "allowLoopback": True}, f"{site.url}/image")
    assert result["body"] is None and result["contentType"] == "image/png"


async def test_redirects_are_followed_and_each_hop_is_checked_again(site: Site) -> None:
    config = {"allowedHosts": ["127.0.0.1", "169.254.169.254"], "allowLoopback": True}
    result = await _fetch(config, f"{site.url}/hop")
    assert result["body"] == "release notes: v2 is out" and result["url"].endswith("/docs")
    error = await _refusal(config, f"{site.url}/away")
    assert error.code == "address_refused" and "metadata" in error.message


def test_http_fetch_without_an_allowlist_is_an_invalid_spec() -> None:
    with pytest.raises(
        InvalidToolSpec, match=r"spec\.tools\[0\]\.builtin\.config: http_fetch: allowedHosts is required"
    ):
        check_tools(_spec({}))


def test_unknown_http_fetch_config_keys_are_rejected() -> None:
    with pytest.raises(InvalidToolSpec, match="unknown keys \\['allowEverything'\\]"):
        check_tools(_spec({"allowedHosts": ["a"], "allowEverything": True}))
