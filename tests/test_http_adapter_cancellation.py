"""A caller that goes away while the HTTP adapter waits on the gateway cancels that call (the gateway stops the
work) and returns its lease of the body budget at once, rather than holding both to the gateway's deadline. In
process: the adapter as the gateway starts it, over a real grpc.aio server on its Unix socket whose Score waits."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.runtime.settings import load_settings
from sie_gateway.http_adapter.server import InternalSocket, start_http_adapter
from sie_gateway.settings import GatewaySettings
from sie_stack.processes import free_port


class SlowGateway(inference_pb2_grpc.InferenceServicer):
    """Score waits until cancelled, and says when it started and when it was cancelled."""

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


@pytest.mark.asyncio
async def test_a_caller_gone_cancels_its_gateway_call_and_returns_its_budget() -> None:
    port = free_port()
    settings = load_settings(GatewaySettings, environ={"SIE_GATEWAY_HTTP_PORT": str(port)})
    socket = InternalSocket()
    gateway = SlowGateway()
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(gateway, server)
    server.add_insecure_port(socket.target)
    await server.start()
    adapter = await start_http_adapter(settings, socket)
    try:
        body = {"model": "m/reranker", "query": "q", "documents": ["a", "b"]}
        async with aiohttp.ClientSession() as session:
            post = asyncio.create_task(session.post(f"http://127.0.0.1:{port}/v1/rerank", json=body))
            await asyncio.wait_for(gateway.started.wait(), timeout=10)
            assert adapter._adapter.budget.held > 0
            post.cancel()  # the caller goes away: its connection closes
            await asyncio.wait_for(gateway.cancelled.wait(), timeout=10)
        for _ in range(100):
            if adapter._adapter.budget.held == 0:
                break
            await asyncio.sleep(0.05)
        assert adapter._adapter.budget.held == 0
    finally:
        await adapter.stop()
        await server.stop(0)
        socket.remove()
