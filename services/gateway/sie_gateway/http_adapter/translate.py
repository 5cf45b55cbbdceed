"""Translation every wire shares: items into the contract's Item, a "model@profile" name, timings and result ids."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sie.v1 import types_pb2
from sie_gateway.http_adapter.errors import AdapterError, invalid
from sie_gateway.http_adapter.fields import Fields, struct, wrong_type

# Item inputs of the reference SDK this engine has no input for (it takes text and images).
UNSUPPORTED_INPUTS = dict.fromkeys(
    ("audio", "video", "document"), "this engine takes text and images; it has no such input"
) | {"multivector": "this engine scores items it encodes itself; pre-encoded multivectors are not an input"}


def item_message(value: Any, where: str) -> types_pb2.Item:
    """An item: a string (its text), or a map of id, text, images ([{data, format}], data as bytes, or base64 in
    JSON) and metadata."""
    if isinstance(value, str):
        return types_pb2.Item(text=value)
    fields = Fields(value, where, UNSUPPORTED_INPUTS)
    item = types_pb2.Item(id=fields.text("id") or "")
    text = fields.text("text")
    if text is not None:
        item.text = text
    images = fields.get("images")
    if images is not None:
        if not isinstance(images, list):
            raise wrong_type(f"{where}.images", "an array of images", images)
        item.images.extend(_image(image, f"{where}.images[{index}]") for index, image in enumerate(images))
    metadata = struct(fields.mapping("metadata"), f"{where}.metadata")
    if metadata is not None:
        item.metadata.CopyFrom(metadata)
    fields.done("id, text, images, metadata")
    return item


def _image(value: Any, where: str) -> types_pb2.Image:
    fields = Fields(value, where)
    data = fields.required("data")
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except binascii.Error:
            raise invalid(f"{where}.data must be the image's bytes (base64 in JSON)", field=f"{where}.data") from None
    if not isinstance(data, bytes):
        raise wrong_type(f"{where}.data", "bytes", data)
    image = types_pb2.Image(data=data, format=fields.text("format") or "")
    fields.done("data, format")
    return image


def items_of(value: Any, where: str, max_items: int) -> list[types_pb2.Item]:
    """An array of items, at most `max_items` (SIE_MAX_ITEMS_PER_REQUEST), each read as item_message reads it."""
    if not isinstance(value, list):
        raise wrong_type(where, "an array of items", value)
    if len(value) > max_items:
        raise invalid(
            f"{where} has {len(value)} items; the limit is {max_items} (SIE_MAX_ITEMS_PER_REQUEST)",
            reason="TOO_MANY_ITEMS",
            field=where,
        )
    return [item_message(item, f"{where}[{index}]") for index, item in enumerate(value)]


def model_and_profile(name: str) -> tuple[str, str]:
    """("model", "profile") of "model@profile"; ("model", "") without a profile."""
    model, at, profile = name.rpartition("@")
    if not at:
        return name, ""
    if not model or not profile:
        raise AdapterError(400, "INVALID_MODEL", f"model {name[:200]!r}: write it as model or model@profile")
    return model, profile


def timing(message: types_pb2.Timing) -> dict[str, float]:
    """The server's time on a request, in ms, as the reference's TimingInfo names it."""
    return {
        "total_ms": message.total_ms,
        "queue_ms": message.queue_ms,
        "tokenization_ms": message.tokenization_ms,
        "inference_ms": message.inference_ms,
        "postprocessing_ms": message.postprocessing_ms,
    }


def result_id(sent: str, index: int) -> str:
    """The id a result carries: the item's own, or `item-<index>` for an item sent without one (as sie_client)."""
    return sent or f"item-{index}"
