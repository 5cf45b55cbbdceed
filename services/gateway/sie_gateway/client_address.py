"""Whose request a connection carries, for its share of the request budget: the client address a trusted proxy names in
x-sie-client-address (Envoy writes it over whatever its client sent), else the connection's own peer.

Applications may reach the gateway's ports without Envoy; a header from them is not believed, or each name it made up
would be a caller with a share of its own (one client held the whole budget that way, issue 32). For the same reason an
IPv6 client is its /64: a host or site is given at least a /64 and may send from any address in it."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from sie_common.runtime.settings import SettingsError

# Longest client address kept from the header (an IPv6 address with a zone is under 64 characters).
MAX_CLIENT_ADDRESS_CHARS = 64
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# The IPv6 prefix one caller is given (RFC 6177: end sites get a /64 or more, and choose their addresses in it).
IPV6_CALLER_PREFIX = 64
# IPv6 ranges that carry an IPv4 client's address in their last 32 bits, as a translator in front of an IPv6-only
# service names its IPv4 clients: the well-known NAT64 prefix (RFC 6052) and IPv4-translated addresses (RFC 2765).
# Each such address is its IPv4 client, not a /64 that every IPv4 client behind the translator would share.
IPV4_EMBEDDING = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("::ffff:0:0:0/96"))


def trusted_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """SIE_GATEWAY_TRUSTED_PROXIES's addresses and CIDR ranges; SettingsError naming an entry that is neither."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise SettingsError(
                f"SIE_GATEWAY_TRUSTED_PROXIES: {entry[:80]!r} is not an IP address or CIDR range (e.g. 10.0.0.0/8)"
            ) from None
    return tuple(networks)


class ClientAddresses:
    """The client address of a connection from `peer`, trusting the named address only from `trusted` proxies."""

    def __init__(self, trusted: Iterable[str]) -> None:
        self._trusted = trusted_networks(trusted)

    def client(self, peer: str, named: object) -> str:
        """The caller: `named` (the header's value) when `peer` (an IP address, without port) is a trusted proxy and
        names one, else `peer`; as caller_of writes it."""
        if isinstance(named, str) and named and self.trusts(peer):
            return caller_of(named[:MAX_CLIENT_ADDRESS_CHARS])
        return caller_of(peer)

    def trusts(self, peer: str) -> bool:
        """Whether `peer` is a trusted proxy."""
        address = ip_address(peer)
        return address is not None and any(address in network for network in self._trusted)


def ip_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `text` writes (None if it writes none); an IPv4 address mapped into IPv6 ('::ffff:10.0.0.5', as
    a dual-stack socket names an IPv4 peer) is that IPv4 address."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def caller_of(address: str) -> str:
    """The caller a client address stands for: an IPv4 address itself (also mapped into IPv6, or embedded by a
    translator: IPV4_EMBEDDING; never trusted as a proxy for it); an IPv6 address its /64 ('2001:db8:7:1::/64', its
    zone dropped); anything else (a proxy's header that is no address) as written."""
    parsed = ip_address(address)
    if parsed is None:
        return address
    if isinstance(parsed, ipaddress.IPv4Address):
        return str(parsed)
    if any(parsed in embedding for embedding in IPV4_EMBEDDING):
        return str(ipaddress.IPv4Address(int(parsed) & 0xFFFFFFFF))
    prefix = int(parsed) >> (128 - IPV6_CALLER_PREFIX) << (128 - IPV6_CALLER_PREFIX)
    return str(ipaddress.IPv6Network((prefix, IPV6_CALLER_PREFIX)))
