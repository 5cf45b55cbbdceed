"""Between sie.v1 messages and the worker's own types: requests into jobs (their own fields checked, within the
worker's bounds), outcomes and served models into answers, a Work request's timeout into seconds."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from google.protobuf import duration_pb2, json_format, struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_common.cluster.model_config import OUTPUT_TYPES
from sie_common.edge.errors import InvalidArgument, clipped
from sie_common.edge.request_bounds import check_name, check_request
from sie_common.edge.request_params import merged_request
from sie_contract.tensors import to_tensor
from sie_worker.adapters.items import Entity, Extraction
from sie_worker.batching.stats import BatchStats
from sie_worker.engine.describe import describe
from sie_worker.engine.jobs import (
    EncodedOutput,
    EncodeJob,
    EncodeOutcome,
    ExtractJob,
    ExtractOutcome,
    ImageInput,
    ItemInput,
    ScoreJob,
    ScoreOutcome,
    Timing,
)
from sie_worker.engine.limits import Limits
from sie_worker.engine.postprocess import OUTPUT_DTYPES, Quantized
from sie_worker.models.registry import ModelRegistry, ModelState

# Each registry state by its proto enum value's name, which the message constructor takes (Value() checks it exists).
_MODEL_STATES = {
    state: inference_pb2.ModelState.Name(inference_pb2.ModelState.Value(f"MODEL_STATE_{state.name}"))
    for state in ModelState
}


def describe_model(registry: ModelRegistry, model_id: str) -> inference_pb2.Model:
    """A served model as ListModels and DescribeModel answer it (NOT_FOUND if it is not served)."""
    model = describe(registry, model_id)
    config = model.config
    described = inference_pb2.Model(
        id=config.id,
        tasks=config.tasks,
        output_types=config.output_types,
        dims=model.dims,
        max_sequence_length=model.max_sequence_length,
        profiles=sorted(config.profiles),
        state=_MODEL_STATES[model.state],
        stats=inference_pb2.ModelStats(
            requests=model.stats.requests, items=model.stats.items, forward_passes=model.stats.forward_passes
        ),
        inputs=config.inputs,
        memory_bytes=model.memory_bytes,
        loras=sorted(config.loras),
        loaded_loras=model.loaded_loras,
    )
    if model.failure is not None:
        described.failure.CopyFrom(
            inference_pb2.ModelLoadFailure(
                error=model.failure.error,
                attempts=model.failure.attempts,
                permanent=model.failure.permanent,
                retry_in_s=model.failure.retry_in_s(),
            )
        )
    return described


def encode_job(request: inference_pb2.EncodeRequest, limits: Limits) -> EncodeJob:
    """An EncodeRequest's own fields, checked within `limits` (the model checks its part later), as a job."""
    request = _checked(request, limits)
    items = _items(request.items)
    output_types = tuple(dict.fromkeys(request.output_types))  # none: the model's default (engine)
    for output in output_types:
        if output not in OUTPUT_TYPES:
            raise InvalidArgument(
                f"output_types: unknown output type {clipped(output)!r}; known: {', '.join(OUTPUT_TYPES)}",
                reason="UNKNOWN_OUTPUT_TYPE",
                metadata={"output_type": clipped(output)},
            )
    dtype = request.output_dtype or "float32"
    if dtype not in OUTPUT_DTYPES:
        raise InvalidArgument(
            f"output_dtype: {clipped(dtype)!r} is not one of {', '.join(OUTPUT_DTYPES)}",
            reason="UNKNOWN_OUTPUT_DTYPE",
            metadata={"output_dtype": clipped(dtype)},
        )
    return EncodeJob(
        model=request.model,
        items=items,
        output_types=output_types,
        output_dtype=dtype,
        instruction=request.instruction if request.HasField("instruction") else None,
        is_query=request.is_query,
        dims=request.dims if request.HasField("dims") else None,
        profile=request.profile,
        lora=request.lora,
        options=_options(request.options),
        debug=request.debug,
    )


def score_job(request: inference_pb2.ScoreRequest, limits: Limits) -> ScoreJob:
    request = _checked(request, limits)
    if not request.query.HasField("text") and not request.query.images:
        raise InvalidArgument(
            "query: a query with text (or, for image models, an image) is required", reason="MISSING_QUERY"
        )
    if request.HasField("top_k") and request.top_k < 0:
        raise InvalidArgument(f"top_k must be 0 (all) or positive, got {request.top_k}", reason="INVALID_TOP_K")
    return ScoreJob(
        model=request.model,
        query=_item(request.query, None),
        items=_items(request.items),
        top_k=request.top_k or None,
        instruction=request.instruction if request.HasField("instruction") else None,
        profile=request.profile,
        lora=request.lora,
        options=_options(request.options),
        debug=request.debug,
    )


def extract_job(request: inference_pb2.ExtractRequest, limits: Limits) -> ExtractJob:
    request = _checked(request, limits)
    options = _options(request.options)
    return ExtractJob(
        model=request.model,
        items=_items(request.items),
        labels=tuple(dict.fromkeys(request.labels)),
        threshold=request.threshold if request.HasField("threshold") else None,
        profile=request.profile,
        lora=request.lora,
        options=options,
        debug=request.debug,
    )


Request = TypeVar("Request", inference_pb2.EncodeRequest, inference_pb2.ScoreRequest, inference_pb2.ExtractRequest)


def _checked(request: Request, limits: Limits) -> Request:
    """The request with `params` and field-like options folded into its fields, its bounded fields checked once
    (sie_common.edge.request_bounds.check_request, as the gateway checks them), and a model named."""
    request = merged_request(request, limits)
    check_request(request, limits)
    if not request.model:
        raise InvalidArgument("model is required", reason="MISSING_MODEL")
    return request


def require_model(model: str, limits: Limits) -> None:
    """A model id named, within SIE_MAX_NAME_BYTES (DescribeModel, GetModel)."""
    if not model:
        raise InvalidArgument("model is required", reason="MISSING_MODEL")
    check_name("model", model, limits)


def _items(items: Sequence[types_pb2.Item]) -> list[ItemInput]:
    """The request's items; whether the model takes their inputs (text, images) is checked against its config later."""
    if not items:
        raise InvalidArgument("items: at least one item is required", reason="NO_ITEMS")
    return [_item(item, index) for index, item in enumerate(items)]


def _item(message: types_pb2.Item, index: int | None) -> ItemInput:
    text = message.text if message.HasField("text") else None
    images = tuple(ImageInput(image.data, image.format) for image in message.images) if message.images else ()
    item = ItemInput(text, images, message.id, index)  # positional: this runs for every item of every request
    if text is None and not images:
        raise InvalidArgument(
            f"{item.label}: has no text (and no images)", reason="ITEM_WITHOUT_TEXT", metadata=item.metadata
        )
    return item


def _options(options: struct_pb2.Struct) -> dict[str, Any]:
    """The request's run-time options as plain values (`options.lora` and the other field-like keys were folded
    into their fields before: sie_common.edge.request_params)."""
    try:
        values = json_format.MessageToDict(options)
    except (
        json_format.SerializeToJsonError,
        ValueError,
    ) as error:  # NaN or Infinity in a number value (a bare Struct raises ValueError)
        raise InvalidArgument(f"options must be plain JSON values: {error}", reason="INVALID_OPTIONS") from None
    return values


def encode_response(request: inference_pb2.EncodeRequest, outcome: EncodeOutcome) -> inference_pb2.EncodeResponse:
    return inference_pb2.EncodeResponse(
        request_id=request.request_id,
        model=outcome.model,
        results=[_encode_result(item.id, output) for item, output in zip(request.items, outcome.items, strict=True)],
        timing=_timing(outcome.timing),
        tokens=outcome.tokens,
    )


def _encode_result(item_id: str, output: EncodedOutput) -> inference_pb2.EncodeResult:
    result = inference_pb2.EncodeResult(id=item_id)
    if output.dense is not None:
        result.dense.CopyFrom(_tensor(output.dense))
    if output.multivector is not None:
        result.multivector.CopyFrom(_tensor(output.multivector))
    if output.sparse is not None:
        result.sparse.CopyFrom(
            types_pb2.SparseVector(
                indices=output.sparse.indices.tolist(), values=output.sparse.values.tolist(), dims=output.sparse.dims
            )
        )
    return result


def _tensor(quantized: Quantized) -> types_pb2.Tensor:
    return to_tensor(quantized.values, quantized.dtype, scale=quantized.scale, offset=quantized.offset)


def score_response(request: inference_pb2.ScoreRequest, outcome: ScoreOutcome) -> inference_pb2.ScoreResponse:
    return inference_pb2.ScoreResponse(
        request_id=request.request_id,
        model=outcome.model,
        scores=[
            inference_pb2.ScoreEntry(
                item_id=request.items[entry.index].id, index=entry.index, score=entry.score, rank=rank
            )
            for rank, entry in enumerate(outcome.ranked)
        ],
        timing=_timing(outcome.timing),
        tokens=outcome.tokens,
        images=len(request.query.images) + sum(len(item.images) for item in request.items),
    )


def extract_response(request: inference_pb2.ExtractRequest, outcome: ExtractOutcome) -> inference_pb2.ExtractResponse:
    return inference_pb2.ExtractResponse(
        request_id=request.request_id,
        model=outcome.model,
        results=[_extract_result(item.id, result) for item, result in zip(request.items, outcome.results, strict=True)],
        timing=_timing(outcome.timing),
    )


def _extract_result(item_id: str, extraction: Extraction) -> inference_pb2.ExtractResult:
    result = inference_pb2.ExtractResult(
        id=item_id,
        entities=[_entity(entity) for entity in extraction.entities],
        classifications=[
            inference_pb2.Classification(label=found.label, score=found.score) for found in extraction.classifications
        ],
        relations=[
            inference_pb2.Relation(
                head=_entity(relation.head), tail=_entity(relation.tail), label=relation.label, score=relation.score
            )
            for relation in extraction.relations
        ],
        objects=[
            inference_pb2.DetectedObject(
                label=found.label,
                score=found.score,
                box=inference_pb2.Box(
                    x_min=found.box.x_min, y_min=found.box.y_min, x_max=found.box.x_max, y_max=found.box.y_max
                ),
            )
            for found in extraction.objects
        ],
    )
    if extraction.data is not None:
        result.data.update(extraction.data)
    return result


def _entity(entity: Entity) -> inference_pb2.Entity:
    return inference_pb2.Entity(
        text=entity.text, label=entity.label, score=entity.score, start=entity.start, end=entity.end
    )


def _timing(timing: Timing) -> types_pb2.Timing:
    return types_pb2.Timing(
        queue_ms=timing.queue_ms,
        tokenization_ms=timing.tokenization_ms,
        inference_ms=timing.inference_ms,
        postprocessing_ms=timing.postprocessing_ms,
        total_ms=timing.total_ms,
        batches=[_batch_stats(batch) for batch in timing.batches],
    )


def _batch_stats(stats: BatchStats) -> types_pb2.BatchStats:
    """The dataclass's fields are the message's, by name; padding_fraction is derived."""
    return types_pb2.BatchStats(**dataclasses.asdict(stats), padding_fraction=stats.padding_fraction)


def work_timeout(timeout: duration_pb2.Duration, limits: Limits) -> float:
    """A Work request's timeout in seconds, cut to SIE_MAX_REQUEST_TIMEOUT_S (0 or less: already expired).

    Read from the fields as they are: any int64 seconds is a number here, where Duration.ToTimedelta overflows."""
    return min(timeout.seconds + timeout.nanos / 1e9, limits.request_timeout_s)
