"""An EncodeStream the server ends as it opens (a server that is not SIE answers UNIMPLEMENTED, a gateway refuses a
missing token) reports the server's status every time. grpc.aio replaces that status with its own INTERNAL "Internal
error from Core" when a write of the client's is in flight as the stream ends (grpc/grpc#36066): 72 of 200 such
streams reported INTERNAL before, and each left a pending grpc task and an async generator that asyncio logged as
errors when they were collected. Against real gRPC servers."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

import foreign_servers
from sie.v1 import inference_pb2_grpc
from sie_client import AuthError, ServerError, SIEClient
from sie_common.edge.auth import Authorize, inference_checks

# More than one request (each of stream_batch_size items) opens an EncodeStream.
ITEMS = ["a"] * 300
TRIES = 40


@pytest.fixture
def health_only_server() -> Iterator[str]:
    with foreign_servers.health_only_server() as target:
        yield target


def test_a_stream_to_a_server_that_is_not_sie_is_unimplemented_every_time(health_only_server: str, caplog) -> None:
    codes = []
    with caplog.at_level(logging.ERROR), SIEClient(f"http://{health_only_server}") as client:
        for _ in range(TRIES):
            with pytest.raises(ServerError) as raised:
                client.encode("test/tiny-mean", ITEMS)
            codes.append(raised.value.grpc_code)
            message = str(raised.value)
            assert f"{health_only_server} does not serve sie.v1.Inference/EncodeStream" in message, message
            assert "this does not look like an SIE server" in message, message
        gc.collect()
    assert codes == [grpc.StatusCode.UNIMPLEMENTED] * TRIES, codes
    logged = [record.getMessage() for record in caplog.records if record.name == "asyncio"]
    assert logged == [], logged[:3]


class _Inference(inference_pb2_grpc.InferenceServicer):
    """Never reached: the token check refuses every call first."""


@pytest.fixture
def token_checking_server() -> Iterator[str]:
    """A grpc.aio server behind the gateway's own token check, on a loop of its own (as a gateway runs apart from
    its callers)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[Authorize(inference_checks("static", ("the-token",)))])
        inference_pb2_grpc.add_InferenceServicer_to_server(_Inference(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_stream_refused_for_its_token_says_so_every_time(token_checking_server: str) -> None:
    reasons = []
    with SIEClient(f"http://{token_checking_server}") as client:
        for _ in range(TRIES):
            with pytest.raises(AuthError) as raised:
                client.encode("test/tiny-mean", ITEMS)
            reasons.append((raised.value.grpc_code, raised.value.reason))
    assert reasons == [(grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")] * TRIES, reasons


class _FailsLikeGrpc(inference_pb2_grpc.InferenceServicer):
    """Ends every EncodeStream at once with the very code and message grpc.aio gives a failed write."""

    def EncodeStream(self, request_iterator, context):
        context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")


def test_a_server_that_sends_grpcs_own_internal_text_is_reported_at_once() -> None:
    """Only grpc's debug string tells its replacement from a server's status: the server's is not waited past."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    inference_pb2_grpc.add_InferenceServicer_to_server(_FailsLikeGrpc(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    slowest = 0.0
    try:
        with SIEClient(f"http://127.0.0.1:{port}") as client:
            for _ in range(10):
                started = time.monotonic()
                with pytest.raises(ServerError) as raised:
                    client.encode("test/tiny-mean", ITEMS)
                slowest = max(slowest, time.monotonic() - started)
                assert raised.value.grpc_code == grpc.StatusCode.INTERNAL
                assert "Internal error from Core" in str(raised.value)
    finally:
        server.stop(grace=None)
    assert slowest < 2, f"{slowest:.1f} s to report the server's INTERNAL"
