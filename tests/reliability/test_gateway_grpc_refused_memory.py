"""A gateway keeps nothing of the large messages it refuses, once their calls end (issue 32: each refused 15 MiB
Encode, sent one after another, left about 46 MB in a gateway: 100 MB grew to 2.2 GB after about 45 calls, and stayed
there). grpc kept each call's abort with its traceback, the frames it passed through and their locals (the message's
bytes, the parsed request, its merged copy), and its message receiver the last message it gave, in reference cycles
only a full garbage collection frees.

A real gateway process (on the session's etcd, no model configured): one caller's large messages refused for a text
over its bound, an unknown model, a malformed option, and calls cancelled while they are read or served, one after
another; the gateway's RSS stays within a few messages' worth of where it began. And in-process, the interceptor the
worker and the config service end their handlers with (RejectMalformedRequests): refused calls, unary and streams,
leave none of their bytes behind."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import grpc
import psutil
import pytest
from google.protobuf import struct_pb2

from grpc_helpers import error_reason, items
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.edge.errors import InvalidArgument, abort
from sie_common.edge.malformed_requests import RejectMalformedRequests
from worker_process import WorkerProcess

MiB = 2**20
MESSAGE_BYTES = 15 * MiB
CALLS = 16
# What the gateway may grow by, whatever the number of calls: one refused message costs several times its bytes while
# it is handled (its bytes as grpc received them, as Python bytes, parsed, a merged copy), and the C heap keeps freed
# pages to reuse. main grew by 30 to 46 MB a call, past this after 4 to 8 calls;
# measured with the fix: 30 to 120 MiB after 16 calls.
GROWTH_BOUND = 12 * MESSAGE_BYTES
ENCODE = "/sie.v1.Inference/Encode"
# Items within SIE_MAX_TEXT_BYTES (2 MiB) and SIE_MAX_ITEMS_PER_REQUEST, MESSAGE_BYTES in all.
WITHIN_BOUNDS = items(["x" * (MESSAGE_BYTES // 8)] * 8)


@pytest.fixture(scope="module")
def gateway(etcd_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A gateway of its own (its memory is what is measured), on a prefix with no models."""
    tmp = tmp_path_factory.mktemp("refused-memory")
    process = WorkerProcess(
        {"SIE_ETCD_ENDPOINTS": etcd_server.endpoint, "SIE_ETCD_PREFIX": f"/{tmp.name}/"},
        tmp / "gateway.log",
        module="sie_gateway",
    )
    try:
        process.wait_serving(timeout_s=60)
        yield process
    finally:
        process.stop()


def text_over_its_bound() -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model="no/such-model", items=items(["x" * MESSAGE_BYTES]))


def unknown_model() -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model="no/such-model", items=WITHIN_BOUNDS)


def malformed_option() -> inference_pb2.EncodeRequest:
    options = struct_pb2.Struct()
    options.update({"is_query": "yes"})  # a boolean option given as a string
    return inference_pb2.EncodeRequest(model="no/such-model", items=WITHIN_BOUNDS, options=options)


@pytest.mark.parametrize(
    ("message", "code", "reason"),
    [
        (text_over_its_bound, grpc.StatusCode.INVALID_ARGUMENT, "TEXT_TOO_LONG"),
        (unknown_model, grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
        (malformed_option, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_OPTIONS"),
    ],
)
def test_refused_large_messages_leave_nothing_behind(gateway: WorkerProcess, message, code, reason) -> None:
    raw = message().SerializeToString()
    refusals = asyncio.run(send_one_after_another(gateway, raw, cancel_after_s=None))
    assert refusals == [(code, reason)] * CALLS


def test_calls_cancelled_while_read_or_served_leave_nothing_behind(gateway: WorkerProcess) -> None:
    """Cancelled at delays from at once to past the refusal: each ends CANCELLED, or refused if that came first."""
    raw = unknown_model().SerializeToString()
    refusals = asyncio.run(send_one_after_another(gateway, raw, cancel_after_s=0.02))
    assert set(refusals) <= {(grpc.StatusCode.CANCELLED, ""), (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND")}
    assert (grpc.StatusCode.CANCELLED, "") in refusals


async def send_one_after_another(
    gateway: WorkerProcess, raw: bytes, cancel_after_s: float | None
) -> list[tuple[grpc.StatusCode, str]]:
    """Send `raw` CALLS times, one call after another (call n cancelled n * `cancel_after_s` after it is sent, when
    given): each call's code and reason. Fails as soon as the gateway has grown past GROWTH_BOUND."""
    process = psutil.Process(gateway.process.pid)
    before = process.memory_info().rss
    refusals = []
    options = [("grpc.max_send_message_length", 2 * MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(gateway.address, options=options) as channel:
        encode = channel.unary_unary(ENCODE)
        for n in range(CALLS):
            call = encode(raw, timeout=30)
            if cancel_after_s is not None:
                asyncio.get_running_loop().call_later(n * cancel_after_s, call.cancel)
            try:
                await call
            except asyncio.CancelledError:
                refusals.append((grpc.StatusCode.CANCELLED, ""))
            except grpc.aio.AioRpcError as error:
                cancelled = error.code() == grpc.StatusCode.CANCELLED
                refusals.append((error.code(), "" if cancelled else error_reason(error)))
            else:
                pytest.fail("a call the gateway should refuse was answered")
            grown = process.memory_info().rss - before
            assert grown <= GROWTH_BOUND, f"the gateway grew by {grown // MiB} MiB after {n + 1} refused calls"
    return refusals


class Refuses(inference_pb2_grpc.InferenceServicer):
    """Encode copies its request (as the gateway's merged request does) and refuses it; EncodeStream refuses the
    stream after its first request."""

    async def Encode(
        self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EncodeResponse:
        copy = inference_pb2.EncodeRequest()
        copy.CopyFrom(request)
        await abort(context, InvalidArgument("refused", reason="REFUSED"))

    async def EncodeStream(
        self, requests: AsyncIterator[inference_pb2.EncodeStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
        async for _ in requests:
            await abort(context, InvalidArgument("refused", reason="REFUSED"))
        yield inference_pb2.EncodeStreamResponse()


async def test_the_workers_and_config_services_interceptor_keeps_nothing_of_refused_calls() -> None:
    """RejectMalformedRequests, the outermost handler of the worker and the config service: Python's own allocations
    (tracemalloc; the garbage collector off, as between its rare full collections) after refused 4 MiB calls."""
    server = grpc.aio.server(
        interceptors=[RejectMalformedRequests()], options=[("grpc.max_receive_message_length", 8 * MiB)]
    )
    inference_pb2_grpc.add_InferenceServicer_to_server(Refuses(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    request = inference_pb2.EncodeRequest(model="m", items=items(["x" * MiB] * 4))
    collecting = gc.isenabled()
    gc.disable()
    tracemalloc.start()
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 8 * MiB)]
        ) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.Encode(request)
                assert error_reason(caught.value) == "REFUSED"
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    async for _ in stub.EncodeStream(iter([inference_pb2.EncodeStreamRequest(request=request)])):
                        pass
                assert error_reason(caught.value) == "REFUSED"
            await asyncio.sleep(0.2)
            kept = tracemalloc.get_traced_memory()[0]
        # Before: each refused call kept its 4 MiB of bytes (24 MiB for the 6).
        assert kept < 2 * MiB, f"{kept // MiB} MiB kept after the refused calls ended"
    finally:
        tracemalloc.stop()
        if collecting:
            gc.enable()
        await server.stop(0)
