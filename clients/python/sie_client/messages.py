"""Build request messages from Python arguments and turn responses into dicts of numpy arrays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
from google.protobuf import json_format, struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_client.errors import ItemError
from sie_client.images import image_message
from sie_client.types import (
    AssignedWorkerInfo,
    Box,
    Classification,
    DetectedObject,
    EncodeResult,
    Entity,
    ExtractResult,
    Item,
    ModelDims,
    ModelInfo,
    ModelLoadError,
    ModelRouting,
    ModelState,
    PoolInfo,
    PoolSpecResponse,
    PoolStatusInfo,
    ProfileInfo,
    Relation,
    ScoreEntry,
    ScoreResult,
    ScoreUsage,
    SparseResult,
    TimingInfo,
)
from sie_contract.tensors import from_tensor

# The profile a request that names none gets (sie_common.cluster.model_config.DEFAULT_PROFILE).
DEFAULT_PROFILE = "default"

# An item: a dict of the Item keys (Item(...) builds one), or a str (its text).
ItemLike = Item | str | Mapping[str, Any]

ITEM_FIELDS = ("id", "text", "images", "metadata")
# Item keys of the reference SDK that this engine has no input for.
UNSUPPORTED_ITEM_FIELDS = ("audio", "video", "document", "multivector")


def is_single(items: object) -> bool:
    """One item (a str or a dict), as opposed to a list of them."""
    return isinstance(items, (str, Mapping))


def as_batch(items: ItemLike | Sequence[ItemLike]) -> Sequence[ItemLike]:
    """A list of one for one item; a list as it is."""
    return [items] if isinstance(items, (str, Mapping)) else items


def item_message(item: ItemLike, role: str = "an item") -> types_pb2.Item:
    """An item as the contract's Item; ItemError for a key it does not know or cannot send, or a value of the wrong
    type (before anything is sent). `role` is what the caller gave it as, for the TypeError of a non-item ("score's
    query")."""
    if isinstance(item, str):
        return types_pb2.Item(text=item)
    if not isinstance(item, Mapping):
        raise TypeError(f"{role} is an Item, a str or a dict, not {type(item).__name__}")
    fields = cast(Mapping[str, Any], item)  # its keys are checked here, at run time
    for field in fields:
        if field in UNSUPPORTED_ITEM_FIELDS and fields[field] is not None:
            raise ItemError(f"item field {field!r} is not supported: this engine takes text and images", field=field)
        if field not in ITEM_FIELDS and field not in UNSUPPORTED_ITEM_FIELDS:
            raise ItemError(f"unknown item field {field!r}; an item has {', '.join(ITEM_FIELDS)}", field=str(field))
    item_id, text, images, metadata = (fields.get(field) for field in ITEM_FIELDS)
    for field, value in (("id", item_id), ("text", text)):
        if value is not None and not isinstance(value, str):
            raise ItemError(f"item field {field!r} is a str, not {type(value).__name__}", field=field)
    if images is not None and not isinstance(images, (list, tuple)):
        # A str would be read as one file per character, bytes as one image per byte.
        raise ItemError(f"item field 'images' is a list of images, not {type(images).__name__}", field="images")
    if metadata is not None and not (isinstance(metadata, Mapping) and all(isinstance(key, str) for key in metadata)):
        raise ItemError("item field 'metadata' is a dict with str keys", field="metadata")
    message = types_pb2.Item(id=item_id or "")
    if text is not None:
        message.text = text
    message.images.extend(image_message(image) for image in images or ())
    if metadata:
        message.metadata.update(metadata)
    return message


def options_struct(options: Mapping[str, Any] | None) -> struct_pb2.Struct | None:
    """The options as sent: unchanged, so the server sees the reference SDK's keys (`lora`, `is_query`, ...) as
    given."""
    if not options:
        return None
    struct = struct_pb2.Struct()
    struct.update(dict(options))
    return struct


def encode_request(
    model: str,
    items: Sequence[ItemLike],
    *,
    output_types: Sequence[str] | None,
    output_dtype: str | None,
    instruction: str | None,
    is_query: bool,
    dims: int | None,
    profile: str | None,
    lora: str | None,
    options: Mapping[str, Any] | None,
    debug: bool = False,
) -> inference_pb2.EncodeRequest:
    request = inference_pb2.EncodeRequest(
        model=model,
        items=[item_message(item) for item in items],
        output_types=list(output_types or ()),
        output_dtype=output_dtype or "",
        is_query=is_query,
        profile=profile or "",
        lora=lora or "",
        debug=debug,
    )
    if instruction is not None:
        request.instruction = instruction
    if dims is not None:
        request.dims = dims
    struct = options_struct(options)
    if struct is not None:
        request.options.CopyFrom(struct)
    return request


def timing(message: types_pb2.Timing) -> TimingInfo:
    result = TimingInfo(
        queue_ms=message.queue_ms,
        tokenization_ms=message.tokenization_ms,
        inference_ms=message.inference_ms,
        postprocessing_ms=message.postprocessing_ms,
        total_ms=message.total_ms,
    )
    if message.batches:
        # Every field with its Python value (MessageToDict would drop zeros and turn uint64 into strings).
        result["batches"] = [
            {field.name: getattr(batch, field.name) for field in batch.DESCRIPTOR.fields} for batch in message.batches
        ]
    return result


def item_id(sent: str, index: int) -> str:
    """The id a result carries: the item's own, or `item-<index>` (its position in the call) for one sent without."""
    return sent or f"item-{index}"


def encode_results(response: inference_pb2.EncodeResponse, first_index: int = 0) -> list[EncodeResult]:
    """The response's results; `first_index` is the position in the call of the response's first item."""
    shared_timing = timing(response.timing)
    results = []
    for index, message in enumerate(response.results, start=first_index):
        result = EncodeResult(model=response.model, id=item_id(message.id, index), timing=shared_timing)
        if message.HasField("dense"):
            result["dense"] = from_tensor(message.dense)
            _add_decode_parameters(result, "dense", message.dense)
        if message.HasField("sparse"):
            result["sparse"] = SparseResult(
                indices=np.asarray(message.sparse.indices, dtype=np.int32),
                values=np.asarray(message.sparse.values, dtype=np.float32),
            )
        if message.HasField("multivector"):
            result["multivector"] = from_tensor(message.multivector)
            _add_decode_parameters(result, "multivector", message.multivector)
        results.append(result)
    return results


def _add_decode_parameters(result: EncodeResult, output: str, tensor: types_pb2.Tensor) -> None:
    """int8 / uint8 rows come with their scale (and offset): `dense_scale`, `dense_offset`, ..."""
    if tensor.scale:
        result[f"{output}_scale"] = np.asarray(tensor.scale, dtype=np.float32)  # type: ignore[literal-required]
    if tensor.offset:
        result[f"{output}_offset"] = np.asarray(tensor.offset, dtype=np.float32)  # type: ignore[literal-required]


def score_result(response: inference_pb2.ScoreResponse, query_id: str | None) -> ScoreResult:
    return ScoreResult(
        model=response.model,
        query_id=query_id,
        scores=[
            ScoreEntry(item_id=item_id(s.item_id, s.index), score=s.score, rank=s.rank, index=s.index)
            for s in response.scores
        ],
        usage=score_usage(response),
        timing=timing(response.timing),
    )


def score_usage(response: inference_pb2.ScoreResponse) -> ScoreUsage:
    """The reference's `usage` block: the tokens the model read, and the images when there were any."""
    usage = ScoreUsage(input_tokens=response.tokens)
    if response.images:
        usage["images"] = response.images
    return usage


def extract_results(response: inference_pb2.ExtractResponse, first_index: int = 0) -> list[ExtractResult]:
    """Each item's results, every kind present (empty where the model produces none); `first_index` as in
    encode_results."""
    shared_timing = timing(response.timing)
    return [
        ExtractResult(
            model=response.model,
            id=item_id(result.id, index),
            entities=[_entity(entity) for entity in result.entities],
            relations=[
                Relation(
                    head=found.head.text,
                    tail=found.tail.text,
                    relation=found.label,
                    score=found.score,
                    head_entity=_entity(found.head),
                    tail_entity=_entity(found.tail),
                )
                for found in result.relations
            ],
            classifications=[Classification(label=found.label, score=found.score) for found in result.classifications],
            objects=[_object(found) for found in result.objects],
            data=json_format.MessageToDict(result.data) if result.HasField("data") else {},
            timing=shared_timing,
        )
        for index, result in enumerate(response.results, start=first_index)
    ]


def _entity(entity: inference_pb2.Entity) -> Entity:
    return Entity(text=entity.text, label=entity.label, score=entity.score, start=entity.start, end=entity.end)


def _object(found: inference_pb2.DetectedObject) -> DetectedObject:
    """`bbox` as [x, y, width, height] in whole pixels (the corners rounded, then the size between them); `box` the
    exact corners."""
    box = found.box
    left, top = round(box.x_min), round(box.y_min)
    return DetectedObject(
        label=found.label,
        score=found.score,
        bbox=[left, top, round(box.x_max) - left, round(box.y_max) - top],
        box=Box(x_min=box.x_min, y_min=box.y_min, x_max=box.x_max, y_max=box.y_max),
    )


def model_info(model: inference_pb2.Model) -> ModelInfo:
    """A model with the reference's keys (state "loaded", profiles by name, last_error, dims of the outputs whose
    width the server reports), then the proto's own fields under their names where the reference has no such key."""
    failure = model.failure if model.HasField("failure") else None
    info = ModelInfo(
        name=model.id,
        loaded=model.state == inference_pb2.MODEL_STATE_LOADED or bool(model.loaded_on),
        state=_STATES.get(model.state, "available"),
        last_error=None
        if failure is None
        else ModelLoadError(
            code="UNKNOWN", message=failure.error, attempts=failure.attempts, permanent=failure.permanent
        ),
        inputs=list(model.inputs),
        outputs=list(model.output_types),
        dims=ModelDims(dense=model.dims) if model.dims and "dense" in model.output_types else ModelDims(),
        max_sequence_length=model.max_sequence_length or None,
        revision=None,
        profiles={name: ProfileInfo(is_default=name == DEFAULT_PROFILE) for name in model.profiles},
        capabilities=None,
        routing=ModelRouting(policy=None, upstream_kind=None),
        aliases=[],
    )
    extra = {key: value for key, value in as_dict(model).items() if key not in info}
    return cast(ModelInfo, {**info, **extra})


_STATES: dict[int, ModelState] = {
    inference_pb2.MODEL_STATE_AVAILABLE: "available",
    inference_pb2.MODEL_STATE_LOADING: "loading",
    inference_pb2.MODEL_STATE_LOADED: "loaded",
    inference_pb2.MODEL_STATE_FAILED: "failed",
    inference_pb2.MODEL_STATE_UNLOADING: "unloading",
}


def pool_info(pool: inference_pb2.Pool) -> PoolInfo:
    """A pool in the reference's nested shape (spec, status), with the proto's fields at the top level too."""
    workers = list(pool.workers)
    info = PoolInfo(
        name=pool.name,
        spec=PoolSpecResponse(name=pool.name, gpus=dict(pool.gpus), bundle=pool.bundle or None),
        status=PoolStatusInfo(
            state="active" if pool.ready else "pending",
            assigned_workers=[
                AssignedWorkerInfo(name=worker, url="", gpu="", bundle=pool.bundle) for worker in workers
            ],
        ),
    )
    return cast(PoolInfo, {**as_dict(pool), **info, "workers": workers})


def as_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
