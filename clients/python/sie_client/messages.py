"""Build request messages from Python arguments and turn responses into dicts of numpy arrays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format, struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_client.images import image_message
from sie_client.types import EncodeResult, Entity, ExtractResult, Item, ScoreResult, Timing
from sie_common.tensors import from_tensor

ItemLike = Item | str


def item_message(item: ItemLike) -> types_pb2.Item:
    if isinstance(item, str):
        return types_pb2.Item(text=item)
    message = types_pb2.Item(id=item.id or "")
    if item.text is not None:
        message.text = item.text
    message.images.extend(image_message(image) for image in item.images or ())
    if item.metadata:
        message.metadata.update(item.metadata)
    return message


def options_struct(options: Mapping[str, Any] | None) -> struct_pb2.Struct | None:
    if not options:
        return None
    struct = struct_pb2.Struct()
    struct.update({key: value for key, value in options.items() if key != "lora"})
    return struct


def lora_of(options: Mapping[str, Any] | None, lora: str | None) -> str:
    """The LoRA adapter: the `lora` argument, or `options["lora"]` as the reference SDK passes it."""
    return lora or str((options or {}).get("lora") or "")


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
        lora=lora_of(options, lora),
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
        result["batches"] = [{field.name: getattr(batch, field.name) for field in batch.DESCRIPTOR.fields} for batch in message.batches]
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


def score_result(response: inference_pb2.ScoreResponse) -> ScoreResult:
    return ScoreResult(
        model=response.model,
        scores=[{"item_id": s.item_id, "index": s.index, "score": s.score, "rank": s.rank} for s in response.scores],
        timing=timing(response.timing),
    )


def extract_results(response: inference_pb2.ExtractResponse) -> list[ExtractResult]:
    shared_timing = timing(response.timing)
    return [
        ExtractResult(
            id=result.id,
            entities=[
                Entity(text=e.text, label=e.label, score=e.score, start=e.start, end=e.end) for e in result.entities
            ],
            timing=shared_timing,
        )
        for result in response.results
    ]


def as_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
