"""Which network addresses a model-driven fetch may reach.

The host allowlist alone is not enough: a permitted name can resolve (or be re-pointed, DNS
rebinding) to the node's loopback, the cloud metadata service or a link-local address. Every
address a name resolves to is checked, and the connection uses only the checked addresses.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "metadata.goog"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class AddressPolicy:
    allow_loopback: bool = False
    allow_link_local: bool = False
    allow_metadata: bool = False
    allow_private: bool = True

    def refusal(self, address: IPAddress) -> str | None:
        """Why the address may not be contacted, or None when it may."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address in METADATA_ADDRESSES:
            return None if self.allow_metadata else "a cloud metadata address"
        if address.is_loopback:
            return None if self.allow_loopback else "a loopback address"
        if address.is_link_local:
            return None if self.allow_link_local else "a link-local address"
        if address.is_unspecified or address.is_multicast or address.is_reserved:
            return "not a unicast address"
        if address.is_private and not self.allow_private:
            return "a private address"
        return None

    def host_refusal(self, host: str) -> str | None:
        if host.lower().rstrip(".") in METADATA_HOSTS and not self.allow_metadata:
            return "a cloud metadata host"
        return None
