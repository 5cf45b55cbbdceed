"""Build request messages from Python arguments and turn responses into dicts of numpy arrays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format, struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_client.errors import ItemError
from sie_client.images import image_message
from sie_client.types import (
    Classification,
    DetectedObject,
    EncodeResult,
    Entity,
    ExtractResult,
    Item,
    Relation,
    ScoreResult,
    Timing,
)
from sie_contract.tensors import from_tensor

ItemLike = Item | str | Mapping[str, Any]

ITEM_FIELDS = ("id", "text", "images", "metadata")
# Item fields of the reference SDK that this engine has no input for.
UNSUPPORTED_ITEM_FIELDS = ("audio", "video")


def is_single(items: object) -> bool:
    """One item (a str, an Item or a dict), as opposed to a list of them."""
    return isinstance(items, (str, Item, Mapping))


def as_batch(items: ItemLike | Sequence[ItemLike]) -> Sequence[ItemLike]:
    """A list of one for one item; a list as it is."""
    return [items] if isinstance(items, (str, Item, Mapping)) else items


def as_item(item: ItemLike) -> Item:
    """An Item from an Item, a str (its text) or a dict of the reference SDK's item fields (ItemError otherwise)."""
    if isinstance(item, Item):
        return item
    if isinstance(item, str):
        return Item(text=item)
    if not isinstance(item, Mapping):
        raise TypeError(f"an item is an Item, a str or a dict, not {type(item).__name__}")
    for field in item:
        if field in UNSUPPORTED_ITEM_FIELDS and item[field] is not None:
            raise ItemError(f"item field {field!r} is not supported: this engine takes text and images", field=field)
        if field not in ITEM_FIELDS and field not in UNSUPPORTED_ITEM_FIELDS:
            raise ItemError(f"unknown item field {field!r}; an item has {', '.join(ITEM_FIELDS)}", field=str(field))
    return Item(**{field: item[field] for field in ITEM_FIELDS if field in item})


def item_message(item: ItemLike) -> types_pb2.Item:
    item = as_item(item)
    for field, value in (("id", item.id), ("text", item.text)):
        if value is not None and not isinstance(value, str):
            raise ItemError(f"item field {field!r} is a str, not {type(value).__name__}", field=field)
    if item.images is not None and not isinstance(item.images, (list, tuple)):
        # A str would be read as one file per character, bytes as one image per byte.
        raise ItemError(f"item field 'images' is a list of images, not {type(item.images).__name__}", field="images")
    if item.metadata is not None and not (
        isinstance(item.metadata, Mapping) and all(isinstance(key, str) for key in item.metadata)
    ):
        raise ItemError("item field 'metadata' is a dict with str keys", field="metadata")
    message = types_pb2.Item(id=item.id or "")
    if item.text is not None:
        message.text = item.text
    message.images.extend(image_message(image) for image in item.images or ())
    if item.metadata:
        message.metadata.update(item.metadata)
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


def timing(message: types_pb2.Timing) -> Timing:
    result = Timing(
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


def encode_results(response: inference_pb2.EncodeResponse) -> list[EncodeResult]:
    shared_timing = timing(response.timing)
    results = []
    for message in response.results:
        result = EncodeResult(id=message.id, timing=shared_timing)
        if message.HasField("dense"):
            result["dense"] = from_tensor(message.dense)
            _add_decode_parameters(result, "dense", message.dense)
        if message.HasField("sparse"):
            result["sparse"] = {
                "indices": np.asarray(message.sparse.indices, dtype=np.uint32),
                "values": np.asarray(message.sparse.values, dtype=np.float32),
            }
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
    """`item_id` is the item's id, or `item-<index>` for an item sent without one (as the reference SDK names it)."""
    return ScoreResult(
        model=response.model,
        query_id=query_id,
        scores=[
            {"item_id": s.item_id or f"item-{s.index}", "index": s.index, "score": s.score, "rank": s.rank}
            for s in response.scores
        ],
        timing=timing(response.timing),
    )


def extract_results(response: inference_pb2.ExtractResponse) -> list[ExtractResult]:
    """Each item's results, every kind present (empty where the model produces none)."""
    shared_timing = timing(response.timing)
    return [
        ExtractResult(
            id=result.id,
            entities=[_entity(entity) for entity in result.entities],
            relations=[
                Relation(head=_entity(found.head), tail=_entity(found.tail), label=found.label, score=found.score)
                for found in result.relations
            ],
            classifications=[Classification(label=found.label, score=found.score) for found in result.classifications],
            objects=[
                DetectedObject(
                    label=found.label,
                    score=found.score,
                    bbox=[found.box.x_min, found.box.y_min, found.box.x_max, found.box.y_max],
                )
                for found in result.objects
            ],
            data=json_format.MessageToDict(result.data) if result.HasField("data") else {},
            timing=shared_timing,
        )
        for result in response.results
    ]


def _entity(entity: inference_pb2.Entity) -> Entity:
    return Entity(text=entity.text, label=entity.label, score=entity.score, start=entity.start, end=entity.end)


def model_dict(model: inference_pb2.Model) -> dict[str, Any]:
    """A model with the proto's field names plus the reference SDK's keys: `name`, `outputs`, `dims` per output
    (the dense width; None where the server does not report one) and `loaded` (in memory here; on a gateway, on a
    worker)."""
    described = as_dict(model)
    described.update(
        name=model.id,
        outputs=list(model.output_types),
        dims={output: (model.dims or None) if output == "dense" else None for output in model.output_types},
        loaded=model.state == inference_pb2.MODEL_STATE_LOADED or bool(model.loaded_on),
    )
    return described


def as_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
