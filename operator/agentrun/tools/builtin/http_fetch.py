"""`http_fetch`: GET a page from an allowlisted host, for agents that read docs or status pages.

The URL comes from the model, so everything about it is distrusted: the host must be on the
allowlist, every address it resolves to is checked (loopback, link-local and cloud metadata are
refused unless the config opts in), redirects are re-checked hop by hop, and the answer is cut at
a size cap.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from agentrun.loop.errors import ToolError
from agentrun.loop.protocols import ToolCall, ToolDefinition, ToolOutput
from agentrun.tools.addresses import AddressPolicy
from agentrun.tools.body_reading import read_capped

MAX_REDIRECTS = 3
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml", "application/x-yaml")
CONFIG_KEYS = {
    "allowedHosts",
    "maxBytes",
    "timeoutSeconds",
    "allowLoopback",
    "allowLinkLocal",
    "allowMetadata",
    "allowPrivate",
}


class AddressRefused(Exception):
    """Raised inside the connector, before any connection is attempted."""


class CheckingResolver(AbstractResolver):
    """Resolves with the system resolver and refuses the whole name if any address is refused."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            reason = self._policy.refusal(ipaddress.ip_address(result["host"]))
            if reason is not None:
                raise AddressRefused(f"{host} resolves to {result['host']}, {reason}")
        return results

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True)
class FetchConfig:
    allowed_hosts: tuple[str, ...]
    max_bytes: int
    timeout_seconds: float
    policy: AddressPolicy

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> FetchConfig:
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise ValueError(f"unknown keys {unknown} (known: {sorted(CONFIG_KEYS)})")
        hosts = config.get("allowedHosts")
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
            raise ValueError("allowedHosts is required: a non-empty list of host names")
        max_bytes = config.get("maxBytes", 200_000)
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or not 1 <= max_bytes <= 10_000_000:
            raise ValueError("maxBytes must be an integer between 1 and 10000000")
        timeout = config.get("timeoutSeconds", 10)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout <= 300:
            raise ValueError("timeoutSeconds must be a number in (0, 300]")
        flags = {}
        for key in ("allowLoopback", "allowLinkLocal", "allowMetadata", "allowPrivate"):
            value = config.get(key, key == "allowPrivate")
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false")
            flags[key] = value
        return cls(
            allowed_hosts=tuple(h.lower().rstrip(".") for h in hosts),
            max_bytes=max_bytes,
            timeout_seconds=float(timeout),
            policy=AddressPolicy(
                allow_loopback=flags["allowLoopback"],
                allow_link_local=flags["allowLinkLocal"],
                allow_metadata=flags["allowMetadata"],
                allow_private=flags["allowPrivate"],
            ),
        )

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for allowed in self.allowed_hosts:
            if allowed.startswith("*."):
                if host.endswith(allowed[1:]):
                    return True
            elif host == allowed:
                return True
        return False


class HTTPFetch:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = FetchConfig.parse(config)
        hosts = ", ".join(self._config.allowed_hosts)
        self.definition = ToolDefinition(
            name="http_fetch",
            description=(
                "Fetches a URL with HTTP GET and returns the status and the (text) body. "
                f"Only these hosts are allowed: {hosts}. Bodies longer than "
                f"{self._config.max_bytes} bytes are cut."
            ),
            input_schema={
                "type": "object",
                "properties": {"url": {"type": "string", "description": "http:// or https:// URL"}},
                "required": ["url"],
                "additionalProperties": False,
            },
        )

    def _check(self, url: str) -> URL:
        try:
            parsed = URL(url)
        except ValueError:
            raise ToolError("invalid_url", f"not a URL: {url[:200]}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ToolError("invalid_url", "only absolute http:// and https:// URLs are fetched")
        host = parsed.host
        if not self._config.host_allowed(host):
            raise ToolError(
                "host_not_allowed",
                f"host {host} is not on this tool's allowlist",
                hint=f"allowed hosts: {', '.join(self._config.allowed_hosts)}",
            )
        reason = self._config.policy.host_refusal(host)
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            pass
        else:
            reason = self._config.policy.refusal(address)
        if reason is not None:
            raise ToolError("address_refused", f"{host} is {reason}; fetching it is not allowed")
        return parsed

    async def call(self, call: ToolCall) -> ToolOutput:
        url = call.input.get("url")
        if not isinstance(url, str) or not url:
            raise ToolError("invalid_input", "url must be a non-empty string", hint='{"url": "https://..."}')
        target = self._check(url)
        connector = aiohttp.TCPConnector(resolver=CheckingResolver(self._config.policy), use_dns_cache=False)
        timeout = aiohttp.ClientTimeout(total=self._config.timeout_seconds)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                for _ in range(MAX_REDIRECTS + 1):
                    async with session.get(target, allow_redirects=False) as response:
                        location = response.headers.get("Location")
                        if response.status in (301, 302, 303, 307, 308) and location:
                            target = self._check(urljoin(str(target), location))
                            continue
                        return await self._answer(target, response)
        except AddressRefused as exc:
            raise ToolError("address_refused", f"{exc}; fetching it is not allowed") from None
        except TimeoutError:
            raise ToolError(
                "timeout", f"no answer within {self._config.timeout_seconds:g}s", hint="try later"
            ) from None
        except aiohttp.ClientError as exc:
            raise ToolError("fetch_failed", f"request failed: {type(exc).__name__}: {exc}") from None
        raise ToolError("too_many_redirects", f"more than {MAX_REDIRECTS} redirects")

    async def _answer(self, url: URL, response: aiohttp.ClientResponse) -> ToolOutput:
        content_type = response.headers.get("Content-Type", "")
        raw = await read_capped(response.content, self._config.max_bytes + 1)
        truncated = len(raw) > self._config.max_bytes
        payload: dict[str, Any] = {"url": str(url), "status": response.status, "contentType": content_type}
        if content_type and not content_type.lower().startswith(TEXT_TYPES):
            payload["body"] = None
            payload["note"] = "non-text content is not shown"
        else:
            payload["body"] = raw[: self._config.max_bytes].decode(response.charset or "utf-8", "replace")
        payload["truncated"] = truncated
        return ToolOutput(json.dumps(payload), is_error=False)
