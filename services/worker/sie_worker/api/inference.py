"""The public sie.v1.Inference API served by a standalone worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.edge import openai_embeddings
from sie_common.edge.answer_size import MAX_SEND_SETTING, check_answer
from sie_common.edge.encode_stream import EncodeStreams
from sie_common.edge.errors import Internal, SieError, Unimplemented, abort
from sie_worker.api.convert import (
    describe_model,
    encode_job,
    encode_response,
    extract_job,
    extract_response,
    require_model,
    score_job,
    score_response,
)
from sie_worker.engine.engine import Engine
from sie_worker.metrics import QUEUE_SECONDS, REQUESTS

log = logging.getLogger(__name__)


class InferenceService(inference_pb2_grpc.InferenceServicer):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._limits = engine.limits
        self._max_answer_bytes = engine.settings.max_send_message_bytes
        self._streams = EncodeStreams(engine.settings)

    # run_*: one request, raising SieError for anything the caller should be told
    # (shared by the unary RPCs, EncodeStream and the internal Work stream). An
    # answer that would not fit in a message is RESOURCE_EXHAUSTED, never sent.

    async def run_encode(self, request: inference_pb2.EncodeRequest) -> inference_pb2.EncodeResponse:
        return await _guarded(
            "encode",
            request,
            lambda: self._engine.encode(encode_job(request, self._limits)),
            lambda o: self._answer(lambda: encode_response(request, o), len(request.items)),
            self._max_answer_bytes,
        )

    async def run_score(self, request: inference_pb2.ScoreRequest) -> inference_pb2.ScoreResponse:
        return await _guarded(
            "score",
            request,
            lambda: self._engine.score(score_job(request, self._limits)),
            lambda o: self._answer(lambda: score_response(request, o), len(request.items)),
            self._max_answer_bytes,
        )

    async def run_extract(self, request: inference_pb2.ExtractRequest) -> inference_pb2.ExtractResponse:
        return await _guarded(
            "extract",
            request,
            lambda: self._engine.extract(extract_job(request, self._limits)),
            lambda o: self._answer(lambda: extract_response(request, o), len(request.items)),
            self._max_answer_bytes,
        )

    async def _answer(self, build: Callable[[], Response], items: int) -> Response:
        """Build an answer message; one of many items on the preprocessing threads (`Engine.off_loop`), so that the
        event loop, and with it every other caller's request, is not held while thousands of results convert."""
        return await self._engine.off_loop(build, items)

    async def Encode(
        self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EncodeResponse:
        try:
            return await self.run_encode(request)
        except SieError as error:
            await abort(context, error)

    async def Score(
        self, request: inference_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ScoreResponse:
        try:
            return await self.run_score(request)
        except SieError as error:
            await abort(context, error)

    async def Extract(
        self, request: inference_pb2.ExtractRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ExtractResponse:
        try:
            return await self.run_extract(request)
        except SieError as error:
            await abort(context, error)

    async def CreateEmbeddings(
        self, request: inference_pb2.CreateEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.CreateEmbeddingsResponse:
        try:
            response = await self.run_encode(openai_embeddings.encode_request(request))
        except SieError as error:
            await abort(context, error)
        return openai_embeddings.embeddings_response(request, response)

    async def EncodeStream(
        self,
        requests: AsyncIterator[inference_pb2.EncodeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
        """Run every request as it arrives; answer each as it completes, tagged by request_id."""
        async for response in self._streams.serve(requests, self.run_encode, context):
            yield response

    async def ListModels(
        self, request: inference_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        registry = self._engine.registry
        return inference_pb2.ListModelsResponse(
            models=[describe_model(registry, model) for model in registry.model_ids],
            config_problems=[
                inference_pb2.ConfigProblem(source=problem.source, message=problem.message)
                for problem in registry.catalog.problems
            ],
        )

    async def GetModel(
        self, request: inference_pb2.GetModelRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.GetModelResponse:
        return inference_pb2.GetModelResponse(
            model=await self.DescribeModel(inference_pb2.DescribeModelRequest(model=request.model), context)
        )

    async def DescribeModel(
        self, request: inference_pb2.DescribeModelRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.Model:
        try:
            require_model(request.model, self._limits)
            return describe_model(self._engine.registry, request.model)
        except SieError as error:
            await abort(context, error)

    async def _no_pools(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Resource pools reserve workers of a cluster, through its gateway: a standalone worker has none."""
        await abort(
            context,
            Unimplemented(
                "resource pools are served by a gateway, which reserves cluster workers for them; this is a "
                "standalone worker: send pool requests to the gateway",
                reason="POOLS_NOT_SERVED",
            ),
        )

    CreatePool = GetPool = ListPools = RenewPool = DeletePool = _no_pools


Outcome = TypeVar("Outcome")
Response = TypeVar("Response", inference_pb2.EncodeResponse, inference_pb2.ScoreResponse, inference_pb2.ExtractResponse)


async def _guarded(
    operation: str,
    request: Any,
    run: Callable[[], Awaitable[Outcome]],
    respond: Callable[[Outcome], Awaitable[Response]],
    max_answer_bytes: int,
) -> Response:
    """Run one request; anything that is not a SieError becomes INTERNAL (logged), and the server keeps serving.

    Every request is counted in the metrics and logged at DEBUG with its latency; log lines written
    while it runs carry its model and request_id. An answer over `max_answer_bytes` is RESOURCE_EXHAUSTED."""
    with REQUESTS.observe(operation, request.model, request.request_id):
        try:
            response = await respond(await run())
        except (SieError, asyncio.CancelledError):
            raise
        except Exception as error:
            log.exception("%s request %r failed", operation, request.request_id)
            raise Internal(f"internal error: {error}", reason="INTERNAL") from error
        check_answer(response, max_answer_bytes, MAX_SEND_SETTING)
        QUEUE_SECONDS.labels(request.model, operation).observe(response.timing.queue_ms / 1000)
        return response
