"""A call refused for its token is answered without its message being read (the worker's and the config service's
unary methods included), and keeps nothing once it ends (issue 32's outside attack: Authorize refused a unary call
with a unary handler, so grpc received the whole message first, and the abort's traceback kept it in a cycle until a
full garbage collection: 96 callers without a token, each sending a 15 MiB AddModel through Envoy at once, took a
config service from 449 to 1,020 MiB, past the 1 GiB the Kubernetes base gives it, and it stayed there).

In-process: the config service's interceptors (Authorize with the admin checks, then RejectMalformedRequests) over its
own servicer's shape, and the Inference service's with a token check; Python's allocations measured with tracemalloc,
the garbage collector off (as between its rare full collections)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import pytest

from grpc_helpers import error_reason
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc
from sie_common.edge.auth import Authorize, inference_checks, token_check
from sie_common.edge.malformed_requests import RejectMalformedRequests

MiB = 2**20
MESSAGE_BYTES = 12 * MiB
CALLS = 4


class Unreachable(config_pb2_grpc.ConfigServiceServicer, inference_pb2_grpc.InferenceServicer):
    """Every method fails the test: a call refused for its token never reaches the servicer."""

    entered = 0

    async def AddModel(self, request: object, context: grpc.aio.ServicerContext) -> config_pb2.AddModelResponse:
        self.entered += 1
        return config_pb2.AddModelResponse()

    async def Encode(self, request: object, context: grpc.aio.ServicerContext) -> inference_pb2.EncodeResponse:
        self.entered += 1
        return inference_pb2.EncodeResponse()

    async def EncodeStream(
        self, requests: AsyncIterator[object], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
        self.entered += 1
        yield inference_pb2.EncodeStreamResponse()


@contextlib.contextmanager
def python_allocations() -> Iterator[Callable[[], tuple[int, int]]]:
    """Python's allocations (now, peak) while the garbage collector is off, as between its rare full collections."""
    collecting = gc.isenabled()
    gc.disable()
    tracemalloc.start()
    try:
        yield tracemalloc.get_traced_memory
    finally:
        tracemalloc.stop()
        if collecting:
            gc.enable()


@pytest.mark.parametrize("method", ["/sie.v1.ConfigService/AddModel", "/sie.v1.Inference/Encode"])
async def test_unary_calls_refused_for_their_token_are_not_read(method: str) -> None:
    checks = {
        "/sie.v1.ConfigService/AddModel": token_check(["the-admin-token"], what="add a model"),
        **inference_checks("static", ["a-token"]),
    }
    server = grpc.aio.server(
        interceptors=[Authorize(checks), RejectMalformedRequests()],
        options=[("grpc.max_receive_message_length", 2 * MESSAGE_BYTES)],
    )
    servicer = Unreachable()
    config_pb2_grpc.add_ConfigServiceServicer_to_server(servicer, server)
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    message = b"\x0a" + b"\xff\xff\xff\x05" + b"x" * MESSAGE_BYTES  # one long field: its bytes are what is measured
    try:
        with python_allocations() as traced:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 2 * MESSAGE_BYTES)]
            ) as channel:
                call = channel.unary_unary(method)
                for _ in range(CALLS):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await call(message, timeout=30)
                    assert (caught.value.code(), error_reason(caught.value)) == (
                        grpc.StatusCode.UNAUTHENTICATED,
                        "MISSING_TOKEN",
                    )
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await call(message, metadata=(("authorization", "Bearer wrong"),), timeout=30)
                    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
                await asyncio.sleep(0.2)
                kept, peak = traced()
            # Before: each refused call's message was received (a peak of at least its bytes) and kept (all 8 of them).
            assert peak < MESSAGE_BYTES, f"a refused call's message was read: peak {peak / MiB:.0f} MiB"
            assert kept < 2 * MiB, f"{kept / MiB:.0f} MiB kept after the refused calls ended"
            assert servicer.entered == 0
    finally:
        await server.stop(0)


async def test_streams_refused_for_their_token_are_answered_with_their_status() -> None:
    server = grpc.aio.server(
        interceptors=[Authorize(inference_checks("static", ["a-token"])), RejectMalformedRequests()]
    )
    servicer = Unreachable()
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.EncodeStream(iter([inference_pb2.EncodeStreamRequest()])):
                    pass
            assert (caught.value.code(), error_reason(caught.value)) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "MISSING_TOKEN",
            )
        assert servicer.entered == 0
    finally:
        await server.stop(0)
