"""What callers pass in (Item) and get back (plain dicts of numpy arrays)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict, cast

import numpy as np

from sie_client.images import ImageLike
from sie_contract.tensors import dequantize_rows


@dataclass
class Item:
    """One input. `id` is echoed back on its result. A dict with these keys works wherever an Item does
    (the reference SDK's items are dicts); any other key is an ItemError naming it.

    `images` (for image models) are encoded bytes (JPEG, PNG, WebP), file paths, PIL images or
    uint8 numpy arrays; the client sends each as encoded bytes (see sie_client.images)."""

    id: str | None = None
    text: str | None = None
    images: list[ImageLike] | None = None
    metadata: dict[str, Any] | None = None


class Timing(TypedDict):
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    postprocessing_ms: float
    total_ms: float
    # With debug=True: the forward passes that carried the request (see docs/batching.md).
    batches: NotRequired[list[dict[str, Any]]]


class SparseVector(TypedDict):
    indices: np.ndarray
    values: np.ndarray


class EncodeResult(TypedDict, total=False):
    id: str
    dense: np.ndarray
    sparse: SparseVector
    multivector: np.ndarray
    # int8 / uint8 outputs: per-row decode parameters, float = q * scale + offset (see dequantize).
    dense_scale: np.ndarray
    dense_offset: np.ndarray
    multivector_scale: np.ndarray
    multivector_offset: np.ndarray
    timing: Timing


def dequantize(result: EncodeResult, output: str = "dense") -> np.ndarray:
    """An int8 / uint8 output decoded to float32 (other dtypes come back as float32 unchanged)."""
    fields = cast(Mapping[str, Any], result)  # keys chosen at run time
    values = np.asarray(fields[output])
    scale = fields.get(f"{output}_scale")
    if scale is None:
        return values.astype(np.float32)
    return dequantize_rows(values, scale, fields.get(f"{output}_offset"))


class ScoreEntry(TypedDict):
    item_id: str
    index: int
    score: float
    rank: int


class ScoreResult(TypedDict):
    model: str
    # The query item's id (None when it had none).
    query_id: str | None
    scores: list[ScoreEntry]
    timing: Timing


class Entity(TypedDict):
    text: str
    label: str
    score: float
    start: int
    end: int


class Classification(TypedDict):
    label: str
    score: float


class Relation(TypedDict):
    head: Entity
    tail: Entity
    label: str
    score: float


class DetectedObject(TypedDict):
    label: str
    score: float
    # [x_min, y_min, x_max, y_max] in pixels of the original image, origin at its top-left corner.
    bbox: list[float]


class ExtractResult(TypedDict):
    id: str
    entities: list[Entity]
    relations: list[Relation]
    classifications: list[Classification]
    objects: list[DetectedObject]
    # What a document model generated ({"text": ...} or a JSON object); {} for other models.
    data: dict[str, Any]
    timing: Timing
