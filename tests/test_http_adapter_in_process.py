"""The HTTP adapter in process, as the gateway starts it, over a real grpc.aio server on its Unix socket standing in
for the gateway (a Score that waits, an Encode with a large answer): a caller that goes away cancels its gateway call
and returns its body-budget lease at once; a large TEI answer is streamed, its memory one element's, not the
whole answer's as Python objects."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from collections.abc import AsyncIterator

import aiohttp
import grpc
import numpy as np
import orjson

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.runtime.settings import load_settings
from sie_gateway.http_adapter.server import HttpAdapter, InternalSocket, start_http_adapter
from sie_gateway.settings import GatewaySettings
from sie_stack.processes import free_port

SPARSE_ITEMS, SPARSE_ENTRIES = 512, 2000  # a million sparse entries, 8 MB of proto


class FakeGateway(inference_pb2_grpc.InferenceServicer):
    """Score waits until cancelled (saying when it started and when it was cancelled); Encode answers SPARSE_ITEMS
    sparse vectors of SPARSE_ENTRIES entries each."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def Score(self, request, context):
        self.started.set()
        try:
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return inference_pb2.ScoreResponse()

    async def Encode(self, request, context):
        indices = list(range(SPARSE_ENTRIES))
        values = np.linspace(0, 1, SPARSE_ENTRIES, dtype=np.float32).tolist()
        sparse = types_pb2.SparseVector(indices=indices, values=values)
        return inference_pb2.EncodeResponse(
            results=[inference_pb2.EncodeResult(sparse=sparse) for _ in range(SPARSE_ITEMS)]
        )


@contextlib.asynccontextmanager
async def running_adapter() -> AsyncIterator[tuple[HttpAdapter, FakeGateway, str]]:
    port = free_port()
    settings = load_settings(GatewaySettings, environ={"SIE_GATEWAY_HTTP_PORT": str(port)})
    socket = InternalSocket()
    gateway = FakeGateway()
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(gateway, server)
    server.add_insecure_port(socket.target)
    await server.start()
    adapter = await start_http_adapter(settings, socket)
    try:
        yield adapter, gateway, f"http://127.0.0.1:{port}"
    finally:
        await adapter.stop()
        await server.stop(0)
        socket.remove()


async def test_a_caller_gone_cancels_its_gateway_call_and_returns_its_budget() -> None:
    async with running_adapter() as (adapter, gateway, base), aiohttp.ClientSession() as session:
        body = {"model": "m/reranker", "query": "q", "documents": ["a", "b"]}
        post = asyncio.create_task(session.post(f"{base}/v1/rerank", json=body))
        await asyncio.wait_for(gateway.started.wait(), timeout=10)
        assert adapter._adapter.budget.held > 0
        post.cancel()  # the caller goes away: its connection closes
        await asyncio.wait_for(gateway.cancelled.wait(), timeout=10)
        for _ in range(100):
            if adapter._adapter.budget.held == 0:
                break
            await asyncio.sleep(0.05)
        assert adapter._adapter.budget.held == 0


async def test_a_large_tei_answer_is_streamed_in_little_memory() -> None:
    async with running_adapter() as (_, _, base), aiohttp.ClientSession() as session:
        tracemalloc.start()
        try:
            async with session.post(f"{base}/tei/m/embed_sparse", json={"inputs": ["x"]}) as response:
                assert response.status == 200, await response.text()
                first, size = b"", 0
                async for chunk in response.content.iter_chunked(2**16):
                    if len(first) < 2**19:
                        first += chunk
                    size += len(chunk)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    element = first[1 : first.index(b"]") + 1]  # the first item's entries
    entries = orjson.loads(element)
    assert len(entries) == SPARSE_ENTRIES and entries[1] == {"index": 1, "value": float(np.float32(1 / 1999))}
    assert size > 40 * 2**20  # about 45 MB of JSON in all
    assert peak < 24 * 2**20, peak  # a few items and chunks at a time (as Python objects it was over 300 MB)
    assert response.headers.get("transfer-encoding") == "chunked"
