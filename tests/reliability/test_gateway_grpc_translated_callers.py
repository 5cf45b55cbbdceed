"""IPv4 clients that reach the gateway through an IPv4-to-IPv6 translator are each a caller of their own (issue 32's
outside attack: with an IPv6 address's /64 as one caller, every IPv4 client a NAT64 or SIIT translator names in
64:ff9b::/96 or ::ffff:0:0:0/96 was the one caller 64:ff9b::/64 or ::/64, so one of them held the share of all).
A translated address is never trusted as a proxy for the IPv4 address it carries."""

from __future__ import annotations

import pytest

from sie_gateway.client_address import ClientAddresses, caller_of


@pytest.mark.parametrize(
    ("address", "caller"),
    [
        ("64:ff9b::203.0.113.9", "203.0.113.9"),  # RFC 6052's well-known NAT64 prefix
        ("64:FF9B:0:0:0:0:CB00:7109", "203.0.113.9"),  # the same, uppercase and uncompressed
        ("::ffff:0:203.0.113.9", "203.0.113.9"),  # IPv4-translated (RFC 2765)
        ("::ffff:203.0.113.9", "203.0.113.9"),  # IPv4-mapped, as a dual-stack socket names an IPv4 peer
        ("2001:db8:7:1::9", "2001:db8:7:1::/64"),
        ("64:ff9b:1::9", "64:ff9b:1::/64"),  # a local-use prefix: where it embeds its IPv4 is the operator's choice
    ],
)
def test_a_translated_ipv4_client_is_its_ipv4_address(address: str, caller: str) -> None:
    assert caller_of(address) == caller


def test_two_ipv4_clients_behind_one_translator_are_two_callers() -> None:
    assert caller_of("64:ff9b::198.51.100.1") != caller_of("64:ff9b::198.51.100.2")
    assert caller_of("::ffff:0:198.51.100.1") != caller_of("::ffff:0:198.51.100.2")


def test_a_translated_loopback_is_no_trusted_proxy() -> None:
    addresses = ClientAddresses(["127.0.0.1", "::1"])
    assert not addresses.trusts("64:ff9b::127.0.0.1")
    assert not addresses.trusts("::ffff:0:127.0.0.1")
    assert addresses.client("64:ff9b::127.0.0.1", "198.51.100.7") == "127.0.0.1"  # its own address, not the header's
