"""The HTTP adapter in process, as the gateway starts it (start_http_adapter, its own aiohttp port), calling a real
grpc.aio server on its Unix socket that stands in for the gateway: its Score and Encode answer from the request (or
wait, where a test needs requests in flight); a test about tokens runs the gateway's own Authorize interceptor."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.runtime.settings import load_settings
from sie_gateway.http_adapter.server import InternalSocket, start_http_adapter
from sie_gateway.settings import GatewaySettings
from sie_stack.processes import free_port

REFERENCE = {"x-sie-sdk-version": "0.10.1", "content-type": "application/json"}
JSON = {"content-type": "application/json"}
RERANK = {"model": "m/reranker", "query": "q", "documents": ["a", "b"]}
MiB = 2**20


class Gateway(inference_pb2_grpc.InferenceServicer):
    """Score answers every item 0.5 (after `release` when `hold`); Encode answers `encode_answer`; DescribeModel a
    model of the id asked (recorded in `described`)."""

    def __init__(self) -> None:
        self.scores: list[inference_pb2.ScoreRequest] = []
        self.described: list[str] = []
        self.hold = False
        self.release = asyncio.Event()
        self.encode_answer = inference_pb2.EncodeResponse()

    async def Score(
        self, request: inference_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ScoreResponse:
        self.scores.append(request)
        if self.hold:
            await self.release.wait()
        return inference_pb2.ScoreResponse(
            model=request.model,
            scores=[inference_pb2.ScoreEntry(index=i, score=0.5, rank=i) for i in range(len(request.items))],
        )

    async def DescribeModel(
        self, request: inference_pb2.DescribeModelRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.Model:
        self.described.append(request.model)
        return inference_pb2.Model(id=request.model)

    async def Encode(
        self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EncodeResponse:
        return self.encode_answer


@contextlib.asynccontextmanager
async def running_adapter(
    gateway: Gateway, env: dict[str, str] | None = None, interceptors: tuple = ()
) -> AsyncIterator[str]:
    """The adapter's base URL, in front of `gateway` (with `interceptors`), with `env` as its settings."""
    port = free_port()
    settings = load_settings(GatewaySettings, environ={"SIE_GATEWAY_HTTP_PORT": str(port), **(env or {})})
    internal = InternalSocket()
    server = grpc.aio.server(interceptors=list(interceptors))
    inference_pb2_grpc.add_InferenceServicer_to_server(gateway, server)
    server.add_insecure_port(internal.target)
    await server.start()
    adapter = await start_http_adapter(settings, internal)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        gateway.release.set()
        await adapter.stop()
        await server.stop(0)
        internal.remove()
