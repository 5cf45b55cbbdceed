"""What adapters read and produce for one item: its tokens, its embeddings, what was extracted from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np


@dataclass(frozen=True)
class TokenizedText:
    ids: list[int]
    # Leading tokens that belong to the prompt (excluded from pooling when the model says so).
    prompt_tokens: int = 0
    # Segment ids (query / item of a pair); empty means all zeros.
    type_ids: list[int] = field(default_factory=list)
    # Character span of each token in the original text; (0, 0) for special tokens.
    offsets: list[tuple[int, int]] = field(default_factory=list)
    # Items flagged as queries (multivector models mark and expand them differently).
    is_query: bool = False


@dataclass(frozen=True)
class SparseWeights:
    """Non-zero vocabulary weights of one item."""

    indices: np.ndarray  # uint32, ascending
    values: np.ndarray  # float32
    dims: int


@dataclass
class EncodedItem:
    """The outputs of one item; only the requested ones are set."""

    dense: np.ndarray | None = None
    sparse: SparseWeights | None = None
    multivector: np.ndarray | None = None  # [tokens, dims]

    def vector(self, output: Literal["dense", "multivector"]) -> np.ndarray:
        """An output the request's plan asked the encoder for: one it did not fill is the adapter's bug."""
        value = self.dense if output == "dense" else self.multivector
        if value is None:
            raise RuntimeError(f"the model's adapter returned no {output} output, which the request computes")
        return value


@dataclass(frozen=True)
class Entity:
    text: str
    label: str
    score: float
    start: int
    end: int


@dataclass(frozen=True)
class Classification:
    label: str
    score: float


@dataclass(frozen=True)
class Relation:
    head: Entity
    tail: Entity
    label: str
    score: float


@dataclass(frozen=True)
class Box:
    """Pixels of the original image, origin at its top-left corner."""

    x_min: float
    y_min: float
    x_max: float
    y_max: float


@dataclass(frozen=True)
class DetectedObject:
    label: str
    score: float
    box: Box


@dataclass(frozen=True)
class Extraction:
    """What an extractor found in one item; each model fills the kinds it produces."""

    entities: list[Entity] = field(default_factory=list)
    classifications: list[Classification] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)
    objects: list[DetectedObject] = field(default_factory=list)
    # Generated from a document: {"text": ...}, or the JSON object a parser produced.
    data: dict[str, Any] | None = None
