"""A trusted proxy reaching the gateway over IPv6 names its clients (SIE_GATEWAY_TRUSTED_PROXIES, default loopback
'127.0.0.1,::1'): grpc writes an IPv6 peer as a URI ('ipv6:%5B::1%5D:41234'), which the gateway did not decode, so no
IPv6 peer was ever trusted and every client behind an IPv6 Envoy (SIE_HOST=::) was one caller with one share. An IPv4
proxy seen on a dual-stack socket ('::ffff:127.0.0.1', as aiohttp names it) was not trusted either."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest

from reliability.test_gateway_grpc_budget import SMALL_BUDGET, HeldCalls, encode_request, from_address, until
from reliability.test_metrics_port_crowding import _ipv6_loopback as ipv6_loopback
from sie.v1 import inference_pb2_grpc
from sie_common.runtime.settings import load_settings
from sie_gateway.client_address import ClientAddresses
from sie_gateway.http_adapter.server import body_budget
from sie_gateway.request_budget import gateway_transport, intake_interceptors, peer_host
from sie_gateway.server import listen_address
from sie_gateway.settings import GatewaySettings
from sie_stack.processes import free_port


def test_peer_host_decodes_grpcs_ipv6_uris() -> None:
    assert peer_host("ipv6:%5B::1%5D:41234") == "::1"
    assert peer_host("ipv6:%5Bfe80::1%25eth0%5D:41234") == "fe80::1%eth0"
    assert peer_host("ipv6:%5B2001:db8::7%5D:443") == "2001:db8::7"


def test_an_ipv4_proxy_mapped_into_ipv6_is_trusted_as_itself() -> None:
    addresses = ClientAddresses(["127.0.0.1", "10.9.0.0/16"])
    assert addresses.client("::ffff:127.0.0.1", "203.0.113.9") == "203.0.113.9"
    assert addresses.client("::ffff:10.9.3.4", "203.0.113.9") == "203.0.113.9"
    # Not a trusted proxy: the peer itself is the caller, an IPv4 one as itself, an IPv6 one as its /64.
    assert addresses.client("::ffff:10.8.3.4", "203.0.113.9") == "10.8.3.4"
    assert addresses.client("fe80::1%eth0", "203.0.113.9") == "fe80::/64"


@pytest.mark.skipif(not ipv6_loopback(), reason="this host has no IPv6 loopback")
@pytest.mark.parametrize(("trusted", "charged"), [("127.0.0.1,::1", "10.0.0.{n}"), ("127.0.0.1", "::/64")])
async def test_a_proxy_on_ipv6_loopback_names_its_clients_when_trusted(trusted: str, charged: str) -> None:
    settings = load_settings(GatewaySettings, environ={**SMALL_BUDGET, "SIE_GATEWAY_TRUSTED_PROXIES": trusted})
    budget = body_budget(settings)
    server = grpc.aio.server(
        interceptors=intake_interceptors(settings, budget), options=gateway_transport(settings).server_options()
    )
    servicer = HeldCalls(settings)
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"[::1]:{port}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"[::1]:{port}")
    try:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = encode_request(2**20)
        calls = [stub.Encode(request, metadata=from_address(f"10.0.0.{n}")) for n in range(2)]
        await until(lambda: servicer.entered == 2)
        held = {n: budget.held_by(f"address {charged.format(n=n)}") for n in range(2)}
        if "{n}" in charged:  # trusted: each named client holds its own message
            assert held == {0: request.ByteSize(), 1: request.ByteSize()}
        else:  # untrusted: both are the proxy's own
            assert held[0] == budget.held == 2 * request.ByteSize()
        servicer.release.set()
        for call in calls:
            await call
    finally:
        servicer.release.set()
        await channel.close()
        await server.stop(0)


def test_the_gateway_listens_on_an_ipv6_host() -> None:
    assert listen_address("0.0.0.0", 50051) == "0.0.0.0:50051"
    assert listen_address("::", 50051) == "[::]:50051"
    assert listen_address("[::1]", 50051) == "[::1]:50051"
    if ipv6_loopback():
        server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
        try:
            assert server.add_insecure_port(listen_address("::1", 0)) > 0
        finally:
            server.stop(0)
