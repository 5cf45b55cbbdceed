"""The gateway's gRPC intake holds at most its request-bytes budget (issue 32: 16 anonymous 15.8 MB Encode messages at
once took a gateway from 295 to 891 MB, 48 more to 1,207 MB, past the 1 GiB the Kubernetes base gives it).

In-process: the gateway's own interceptors (sie_gateway.request_budget.intake_interceptors) over a stand-in servicer
that holds each call (its parsed request and the serialized copy the gateway sends a worker) until released; the
memory bound in a process of its own, with the default budget."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import psutil
import pytest
from google.rpc import status_pb2

from grpc_helpers import error_reason, items, retry_delay_s
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.edge.auth import CLIENT_ADDRESS_HEADER, bearer_metadata
from sie_common.edge.encode_stream import EncodeStreams
from sie_common.edge.errors import status_reason
from sie_common.runtime.settings import load_settings
from sie_gateway.http_adapter.bodies import BodyBudget
from sie_gateway.http_adapter.server import body_budget
from sie_gateway.request_budget import gateway_transport, intake_interceptors, peer_host
from sie_gateway.settings import GatewaySettings
from sie_stack.processes import free_port

MiB = 2**20
# What a message held costs the gateway, as a multiple of its bytes (the adapter's bodies measure about 7).
COST_PER_BYTE = 8
MEMORY_CALLERS = 16
QUICK_MODEL = "quick"


class HeldCalls(inference_pb2_grpc.InferenceServicer):
    """Encode and EncodeStream hold each request (and a serialized copy, as the gateway's Work stream sends) until
    `release` is set; `entered` counts the requests that reached it. Requests for QUICK_MODEL are answered at once."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.release = asyncio.Event()
        self.entered = 0
        self.held: list[object] = []
        self._streams = EncodeStreams(settings)

    async def _hold(self, request: inference_pb2.EncodeRequest) -> inference_pb2.EncodeResponse:
        if request.model == QUICK_MODEL:
            return inference_pb2.EncodeResponse(model=request.model)
        self.entered += 1
        self.held.append((request, request.SerializeToString()))
        await self.release.wait()
        return inference_pb2.EncodeResponse(model=request.model)

    async def Encode(
        self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EncodeResponse:
        return await self._hold(request)

    async def EncodeStream(
        self, requests: AsyncIterator[inference_pb2.EncodeStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
        async for response in self._streams.serve(requests, self._hold, context):
            yield response


@contextlib.asynccontextmanager
async def serving(
    environ: dict[str, str], intake: bool = True, port: int = 0, unix: str | None = None
) -> AsyncIterator[tuple[grpc.aio.Channel, HeldCalls, BodyBudget]]:
    """The stand-in behind the gateway's interceptors (`intake` False: the interceptors before the budget)."""
    settings = load_settings(GatewaySettings, environ=environ)
    budget = body_budget(settings)
    interceptors = intake_interceptors(settings, budget)
    if not intake:
        interceptors = [interceptors[0], interceptors[2]]
    server = grpc.aio.server(interceptors=interceptors, options=gateway_transport(settings).server_options())
    servicer = HeldCalls(settings)
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = port or free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    if unix is not None:  # as the gateway's InternalSocket, which its HTTP adapter calls
        server.add_insecure_port(f"unix:{unix}")
    await server.start()
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", settings.max_receive_message_bytes)]
    )
    try:
        yield channel, servicer, budget
    finally:
        servicer.release.set()
        await channel.close()
        await server.stop(0)


def encode_request(size: int, item_bytes: int = 2000) -> inference_pb2.EncodeRequest:
    """About `size` bytes of many text items (the attack's shape)."""
    return inference_pb2.EncodeRequest(model="m", items=items(["x" * item_bytes] * (size // (item_bytes + 12))))


def from_address(address: str) -> tuple[tuple[str, str]]:
    return ((CLIENT_ADDRESS_HEADER, address),)


async def until(condition: object, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


SMALL_BUDGET = {
    "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES": str(8 * MiB),
    "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES": str(4 * MiB),
    "SIE_MAX_RECEIVE_MESSAGE_BYTES": str(2 * MiB),
    "SIE_GATEWAY_HTTP_MAX_BODY_BYTES": str(2 * MiB),
}
LARGEST = 2 * MiB  # a message being read holds this much of the budget


def admitted(share: int, size: int) -> int:
    """How many messages of `size` bytes a share of `share` bytes reads: each read needs room for the largest."""
    return (share - LARGEST) // size + 1


async def test_one_callers_concurrent_calls_past_its_share_are_resource_exhausted_and_others_still_served() -> None:
    async with serving(SMALL_BUDGET) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = encode_request(MiB * 6 // 5)
        size = request.ByteSize()
        calls = [stub.Encode(request, metadata=from_address("10.0.0.1")) for _ in range(12)]
        await until(lambda: servicer.entered + sum(call.done() for call in calls) == len(calls))
        refused = [call for call in calls if call.done()]
        # Each message read leaves room in the share for one more of the largest size.
        assert servicer.entered == admitted(4 * MiB, size) == 2
        assert budget.held_by("address 10.0.0.1") == 2 * size <= 4 * MiB
        for call in refused:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_reason(caught.value) == "OVERLOADED"
            assert retry_delay_s(caught.value) == 1.0
            assert "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES" in caught.value.details()
        # Another caller's call goes in while the first one's share is full; the whole budget then refuses, keeping
        # room to read one more message of the largest size.
        other = stub.Encode(encode_request(64 * 1024), metadata=from_address("10.0.0.2"))
        await until(lambda: servicer.entered == 3)
        fits = (8 * MiB - LARGEST - budget.held) // size
        assert fits == 2
        third = [stub.Encode(request, metadata=from_address(f"10.0.1.{n}")) for n in range(fits + 2)]
        await until(lambda: servicer.entered + sum(call.done() for call in third) == 3 + len(third))
        assert servicer.entered == 3 + fits
        # A refused read's room comes back just after its caller hears the refusal (a clean-clone run saw it held).
        await until(lambda: budget.held <= 8 * MiB - LARGEST)
        full = [call for call in third if call.done()]
        assert len(full) == 2
        for call in full:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES" in caught.value.details()
        servicer.release.set()
        assert (await other).model == "m"
        for call in [*calls, *third]:
            if call not in refused and call not in full:
                await call
        assert budget.held == 0


async def test_leases_return_when_calls_are_cancelled() -> None:
    async with serving(SMALL_BUDGET) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        calls = [stub.Encode(encode_request(MiB), metadata=from_address("10.0.0.1")) for _ in range(3)]
        await until(lambda: servicer.entered + sum(call.done() for call in calls) == 3)
        assert servicer.entered == 2
        assert budget.held > 2 * MiB - 64 * 1024
        for call in calls:
            call.cancel()
        await until(lambda: budget.held == 0)
        # The share is free again: the same caller is served.
        again = stub.Encode(encode_request(MiB), metadata=from_address("10.0.0.1"))
        await until(lambda: servicer.entered == 3)
        servicer.release.set()
        await again
        assert budget.held == 0


async def test_encode_stream_messages_count_and_wait_for_answers_past_the_share() -> None:
    async with serving(SMALL_BUDGET) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = encode_request(MiB)
        size = inference_pb2.EncodeStreamRequest(request=request).ByteSize()
        stream = stub.EncodeStream(metadata=from_address("10.0.0.1"))
        reads = admitted(4 * MiB, size)
        assert reads == 2
        for _ in range(reads):
            await stream.write(inference_pb2.EncodeStreamRequest(request=request))
        await until(lambda: servicer.entered == reads)
        # A message past the caller's share is not read: flow control holds its sender back, and the stream waits
        # for its answers rather than ending.
        past_share = asyncio.create_task(stream.write(inference_pb2.EncodeStreamRequest(request=request)))
        await asyncio.sleep(0.5)
        assert not past_share.done() and servicer.entered == reads
        assert budget.held_by("address 10.0.0.1") == reads * size
        servicer.release.set()
        await past_share
        await stream.done_writing()
        answers = [answer async for answer in stream]
        assert [answer.request_id for answer in answers] == ["0", "1", "2"]
        assert all(answer.WhichOneof("outcome") == "response" for answer in answers)
        await until(lambda: budget.held == 0)
        # Answered messages give their bytes back: a long stream of them never fills the share.
        stream = stub.EncodeStream(metadata=from_address("10.0.0.1"))
        for n in range(20):
            await stream.write(inference_pb2.EncodeStreamRequest(request=request))
            answer = await stream.read()
            assert answer.request_id == str(n) and answer.WhichOneof("outcome") == "response"
            assert budget.held <= size + LARGEST  # the answered message gone, the next one awaited
        await stream.done_writing()
        await until(lambda: budget.held == 0)


async def test_with_tokens_the_token_is_the_caller() -> None:
    environ = {**SMALL_BUDGET, "SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": "alpha,beta"}
    async with serving(environ) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = encode_request(MiB)
        # Different addresses, one token: one share.
        calls = [
            stub.Encode(request, metadata=(*bearer_metadata("alpha"), *from_address(f"10.0.0.{n}"))) for n in range(5)
        ]
        await until(lambda: servicer.entered + sum(call.done() for call in calls) == 5)
        assert servicer.entered == admitted(4 * MiB, request.ByteSize()) == 2
        assert budget.held_by("token alpha") == 2 * request.ByteSize()
        beta = stub.Encode(request, metadata=bearer_metadata("beta"))
        await until(lambda: servicer.entered == 3)
        # A caller without a valid token holds nothing.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Encode(request, metadata=bearer_metadata("gamma"))
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        servicer.release.set()
        await beta
        await until(lambda: budget.held == 0)


async def test_calls_on_the_adapters_unix_socket_are_not_charged_twice(tmp_path: Path) -> None:
    socket = tmp_path / "grpc.sock"
    async with (
        serving(SMALL_BUDGET, unix=str(socket)) as (_, servicer, budget),
        grpc.aio.insecure_channel(f"unix:{socket}") as channel,
    ):
        call = inference_pb2_grpc.InferenceStub(channel).Encode(encode_request(MiB))
        await until(lambda: servicer.entered == 1)
        assert budget.held == 0
        servicer.release.set()
        await call


def test_peer_host_drops_the_port() -> None:
    assert peer_host("ipv4:10.0.0.5:41234") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:41234") == "::1"


async def test_a_message_larger_than_one_callers_share_is_refused_unread() -> None:
    """grpc receives messages up to the smaller of the receive limit and one caller's share."""
    async with serving({**SMALL_BUDGET, "SIE_MAX_RECEIVE_MESSAGE_BYTES": str(5 * MiB)}) as (channel, servicer, budget):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await inference_pb2_grpc.InferenceStub(channel).Encode(encode_request(9 * MiB // 2))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "4194304" in caught.value.details()  # grpc's own message names its limit
        assert servicer.entered == 0 and budget.held == 0


@pytest.mark.process
def test_many_large_calls_at_once_stay_within_the_budgets_cost() -> None:
    """The attack: 16 callers each sending a 15.8 MB Encode message at once, with the default budget. Without it the
    stand-in gateway held all 16 and grew by 982 MB; now it holds what the budget admits (6), refuses the rest with
    RESOURCE_EXHAUSTED/OVERLOADED, and grows by at most the budget's cost. (The refused messages' bytes still arrive
    whole before they are refused: gRPC gives no size before a message has been read.)"""
    result = asyncio.run(attack(intake=True, calls_per_caller=1))
    settings = load_settings(GatewaySettings, environ={})
    assert 0 < result["admitted"] < result["calls"], result
    assert result["admitted"] * result["message"] <= settings.http_max_body_budget_bytes, result
    assert set(result["refusals"]) == {"RESOURCE_EXHAUSTED OVERLOADED"}, result
    assert result["grown"] <= settings.http_max_body_budget_bytes * COST_PER_BYTE, result


async def attack(intake: bool, calls_per_caller: int) -> dict:
    """The calls from this process, the gateway's interceptors and the stand-in in a process of their own (so its
    memory is its own): its growth at the peak, how many calls it held, and what the others were answered."""
    tests = str(Path(__file__).parents[1])  # grpc_helpers
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen(
        [sys.executable, __file__, "budget" if intake else "none"], env=environ, stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        gateway = psutil.Process(server.pid)
        before = peak = gateway.memory_info().rss
        message = encode_request(15_800_000).SerializeToString()
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 16 * MiB)]
        ) as channel:
            encode = channel.unary_unary("/sie.v1.Inference/Encode")  # the same bytes for every call
            calls = [
                encode(message, metadata=from_address(f"10.0.0.{n % MEMORY_CALLERS}"), timeout=120)
                for n in range(calls_per_caller * MEMORY_CALLERS)
            ]
            settled = 0.0
            while settled < 2.0:  # until no call has ended for 2 s
                done = sum(call.done() for call in calls)
                await asyncio.sleep(0.05)
                peak = max(peak, gateway.memory_info().rss)
                settled = settled + 0.05 if sum(call.done() for call in calls) == done else 0.0
            refusals = await refusals_of(calls)
        return {
            "calls": len(calls),
            "admitted": len(calls) - len(refusals),
            "message": len(message),
            "grown": peak - before,
            "refusals": refusals,
        }
    finally:
        server.kill()
        server.wait()


async def refusals_of(calls: list) -> list[str]:
    """'CODE REASON' of each ended call that failed (the message where no ErrorInfo came, e.g. from Envoy); calls
    still running are cancelled and left out."""
    refusals = []
    for call in calls:
        if not call.done():
            call.cancel()
            continue
        try:
            await call
        except grpc.aio.AioRpcError as error:
            details = dict(error.trailing_metadata()).get("grpc-status-details-bin", b"")
            reason = status_reason(status_pb2.Status.FromString(details)) if details else error.details()
            refusals.append(f"{error.code().name} {reason}")
    return refusals


async def serve_forever(intake: bool) -> None:
    port = free_port()
    async with serving({}, intake, port) as _:
        print(port, flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve_forever(sys.argv[1] == "budget"))
