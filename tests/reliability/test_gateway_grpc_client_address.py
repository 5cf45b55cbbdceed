"""x-sie-client-address names a caller only from a trusted proxy (SIE_GATEWAY_TRUSTED_PROXIES): issue 32, straight to
the gateway's port, each made-up name was a caller with a share of its own, and one client held the whole budget."""

from __future__ import annotations

import grpc
import pytest
from aiohttp.test_utils import make_mocked_request

from reliability.test_gateway_grpc_budget import SMALL_BUDGET, admitted, encode_request, from_address, serving, until
from sie.v1 import inference_pb2_grpc
from sie_common.edge.auth import CLIENT_ADDRESS_HEADER
from sie_common.runtime.settings import SettingsError, load_settings
from sie_gateway.client_address import MAX_CLIENT_ADDRESS_CHARS, ClientAddresses
from sie_gateway.http_adapter.server import body_budget
from sie_gateway.http_adapter.wire import Adapter
from sie_gateway.settings import GatewaySettings

MiB = 2**20
ELSEWHERE = {**SMALL_BUDGET, "SIE_GATEWAY_TRUSTED_PROXIES": "10.9.0.0/16"}


async def test_names_from_an_untrusted_peer_are_one_caller_the_peer() -> None:
    async with serving(ELSEWHERE) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = encode_request(MiB)
        calls = [stub.Encode(request, metadata=from_address(f"10.0.0.{n}")) for n in range(8)]
        await until(lambda: servicer.entered + sum(call.done() for call in calls) == len(calls))
        # One share, whatever the names: the rest refused.
        assert servicer.entered == admitted(4 * MiB, request.ByteSize()) == 2
        assert budget.held_by("address 127.0.0.1") == budget.held == 2 * request.ByteSize()
        for call in calls:
            if call.done():
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call
                assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES" in caught.value.details()
        servicer.release.set()


async def test_a_trusted_proxys_names_are_callers_of_their_own() -> None:
    """The local stack's Envoy connects from loopback, trusted by default: its clients have a share each."""
    async with serving(SMALL_BUDGET) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = encode_request(MiB)
        calls = [stub.Encode(request, metadata=from_address(f"10.0.0.{n}")) for n in range(3)]
        await until(lambda: servicer.entered == 3)
        assert [budget.held_by(f"address 10.0.0.{n}") for n in range(3)] == [request.ByteSize()] * 3
        assert budget.held_by("address 127.0.0.1") == 0
        servicer.release.set()
        for call in calls:
            await call


def test_client_addresses_trust_only_the_listed_networks() -> None:
    addresses = ClientAddresses(["10.9.0.0/16", "fd00::1"])
    assert addresses.client("10.9.3.4", "203.0.113.9") == "203.0.113.9"
    assert addresses.client("fd00::1", "203.0.113.9") == "203.0.113.9"
    assert addresses.client("10.8.3.4", "203.0.113.9") == "10.8.3.4"
    assert addresses.client("10.9.3.4", "") == "10.9.3.4"
    assert addresses.client("not an address", "203.0.113.9") == "not an address"
    assert len(addresses.client("10.9.3.4", "x" * 100_000)) == MAX_CLIENT_ADDRESS_CHARS
    assert ClientAddresses([]).client("127.0.0.1", "203.0.113.9") == "127.0.0.1"


def test_a_malformed_trusted_proxy_is_refused_at_start_up() -> None:
    with pytest.raises(SettingsError, match="SIE_GATEWAY_TRUSTED_PROXIES"):
        load_settings(GatewaySettings, environ={"SIE_GATEWAY_TRUSTED_PROXIES": "10.0.0.0/33"})
    assert load_settings(GatewaySettings, environ={}).trusted_proxies == ("127.0.0.1", "::1")


class LoopbackConnection:
    """What aiohttp asks a connection for a request's remote address."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default


@pytest.mark.parametrize(
    ("trusted", "caller"), [("127.0.0.1", "address 203.0.113.9"), ("10.9.0.0/16", "address 127.0.0.1")]
)
def test_the_http_adapter_trusts_the_same_proxies(trusted: str, caller: str) -> None:
    settings = load_settings(GatewaySettings, environ={"SIE_GATEWAY_TRUSTED_PROXIES": trusted})
    addresses = ClientAddresses(settings.trusted_proxies)
    adapter = Adapter(None, None, body_budget(settings), 1, addresses)  # type: ignore[arg-type]
    request = make_mocked_request(
        "POST", "/v1/rerank", headers={CLIENT_ADDRESS_HEADER: "203.0.113.9"}, transport=LoopbackConnection()
    )
    assert request.remote == "127.0.0.1"
    assert adapter.caller(request) == caller
