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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from sie.v1 import inference_pb2_grpc
from sie_client import AuthError, ServerError, SIEClient
from sie_common.edge.auth import Authorize, inference_checks

# More than one request (each of stream_batch_size items) opens an EncodeStream.
ITEMS = ["a"] * 300
TRIES = 40


@pytest.fixture
def health_only_server() -> Iterator[str]:
    """A real gRPC server that serves grpc.health.v1 and nothing else: what a client meets at a wrong port."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


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
