"""What callers pass in (Item) and get back (plain dicts of numpy arrays)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np


@dataclass
class Item:
    """One input. `id` is echoed back on its result."""

    id: str | None = None
    text: str | None = None
    images: list[bytes] | None = None
    metadata: dict[str, Any] | None = None


class Timing(TypedDict):
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    postprocessing_ms: float
    total_ms: float


class SparseVector(TypedDict):
    indices: np.ndarray
    values: np.ndarray


class EncodeResult(TypedDict, total=False):
    id: str
    dense: np.ndarray
    sparse: SparseVector
    multivector: np.ndarray
    timing: Timing


class ScoreEntry(TypedDict):
    item_id: str
    index: int
    score: float
    rank: int


class ScoreResult(TypedDict):
    model: str
    scores: list[ScoreEntry]
    timing: Timing


class Entity(TypedDict):
    text: str
    label: str
    score: float
    start: int
    end: int


class ExtractResult(TypedDict):
    id: str
    entities: list[Entity]
    timing: Timing
