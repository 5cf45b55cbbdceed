"""The public sie.v1.Inference API served by a standalone worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.concurrent_answers import ConcurrentAnswers
from sie_common.errors import Internal, InvalidArgument, SieError, abort
from sie_common.model_config import OUTPUT_TYPES
from sie_common.tensors import to_tensor
from sie_worker.engine import EncodeJob, EncodeOutcome, Engine
from sie_worker.postprocess import OUTPUT_DTYPES

log = logging.getLogger(__name__)


def encode_job(request: inference_pb2.EncodeRequest) -> EncodeJob:
    """Validate an EncodeRequest's own fields (the model checks its part later)."""
    if not request.model:
        raise InvalidArgument("model is required", reason="MISSING_MODEL")
    if not request.items:
        raise InvalidArgument("items: at least one item is required", reason="NO_ITEMS")
    texts = []
    for index, item in enumerate(request.items):
        if item.images:
            raise InvalidArgument(
                f"items[{index}]: images are not supported by model {request.model} (inputs: text)",
                reason="INPUT_NOT_SUPPORTED",
                metadata={"item": str(index)},
            )
        if not item.HasField("text"):
            raise InvalidArgument(f"items[{index}]: has no text", reason="ITEM_WITHOUT_TEXT", metadata={"item": str(index)})
        texts.append(item.text)
    output_types = tuple(dict.fromkeys(request.output_types)) or ("dense",)
    for output in output_types:
        if output not in OUTPUT_TYPES:
            raise InvalidArgument(
                f"output_types: unknown output type {output!r}; known: {', '.join(OUTPUT_TYPES)}",
                reason="UNKNOWN_OUTPUT_TYPE",
                metadata={"output_type": output},
            )
    dtype = request.output_dtype or "float32"
    if dtype not in OUTPUT_DTYPES:
        raise InvalidArgument(
            f"output_dtype: {dtype!r} is not one of {', '.join(OUTPUT_DTYPES)}",
            reason="UNKNOWN_OUTPUT_DTYPE",
            metadata={"output_dtype": dtype},
        )
    if request.HasField("dims") and request.dims <= 0:
        raise InvalidArgument(f"dims must be positive, got {request.dims}", reason="INVALID_DIMS")
    return EncodeJob(
        model=request.model,
        texts=texts,
        output_types=output_types,
        output_dtype=dtype,
        instruction=request.instruction if request.HasField("instruction") else None,
        is_query=request.is_query,
        dims=request.dims if request.HasField("dims") else None,
        profile=request.profile,
        lora=request.lora,
    )


def encode_response(request: inference_pb2.EncodeRequest, outcome: EncodeOutcome) -> inference_pb2.EncodeResponse:
    timing = outcome.timing
    return inference_pb2.EncodeResponse(
        request_id=request.request_id,
        model=outcome.model,
        results=[
            inference_pb2.EncodeResult(id=item.id, dense=to_tensor(vector, str(outcome.dense.dtype)))
            for item, vector in zip(request.items, outcome.dense)
        ],
        timing=types_pb2.Timing(
            queue_ms=timing.queue_ms,
            tokenization_ms=timing.tokenization_ms,
            inference_ms=timing.inference_ms,
            postprocessing_ms=timing.postprocessing_ms,
            total_ms=timing.total_ms,
        ),
    )


class InferenceService(inference_pb2_grpc.InferenceServicer):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def run_encode(self, request: inference_pb2.EncodeRequest) -> inference_pb2.EncodeResponse:
        """Encode, raising SieError for anything the caller should be told."""
        try:
            outcome = await self._engine.encode(encode_job(request))
        except (SieError, asyncio.CancelledError):
            raise
        except Exception as error:
            log.exception("encode request %r failed", request.request_id)
            raise Internal(f"internal error: {error}", reason="INTERNAL") from error
        return encode_response(request, outcome)

    async def Encode(self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext) -> inference_pb2.EncodeResponse:
        try:
            return await self.run_encode(request)
        except SieError as error:
            await abort(context, error)

    async def EncodeStream(
        self,
        requests: AsyncIterator[inference_pb2.EncodeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
        """Run every request as it arrives; answer each as it completes, tagged by request_id."""
        answers: ConcurrentAnswers[inference_pb2.EncodeStreamResponse] = ConcurrentAnswers()

        async def answer(request: inference_pb2.EncodeRequest) -> inference_pb2.EncodeStreamResponse:
            try:
                return inference_pb2.EncodeStreamResponse(request_id=request.request_id, response=await self.run_encode(request))
            except SieError as error:
                return inference_pb2.EncodeStreamResponse(request_id=request.request_id, error=error.to_status())

        async def feed() -> None:
            ordinal = 0
            async for message in requests:
                request = message.request
                if not request.request_id:
                    request.request_id = str(ordinal)
                ordinal += 1
                if not answers.start(request.request_id, answer(request)):
                    duplicate = InvalidArgument(
                        f"request_id {request.request_id!r} is already in flight on this stream",
                        reason="DUPLICATE_REQUEST_ID",
                    )
                    answers.reply(inference_pb2.EncodeStreamResponse(request_id=request.request_id, error=duplicate.to_status()))

        async for response in answers.stream(feed()):
            yield response

    async def ListModels(self, request: inference_pb2.ListModelsRequest, context: grpc.aio.ServicerContext) -> inference_pb2.ListModelsResponse:
        registry = self._engine.registry
        return inference_pb2.ListModelsResponse(
            models=[registry.describe(model) for model in registry.model_ids],
            config_problems=[
                inference_pb2.ConfigProblem(source=problem.source, message=problem.message) for problem in registry.catalog.problems
            ],
        )

    async def GetModel(self, request: inference_pb2.GetModelRequest, context: grpc.aio.ServicerContext) -> inference_pb2.GetModelResponse:
        try:
            return inference_pb2.GetModelResponse(model=self._engine.registry.describe(request.model))
        except SieError as error:
            await abort(context, error)
