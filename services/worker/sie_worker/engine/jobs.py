"""Validated requests (jobs) and what the engine answers them with (outcomes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sie_worker.adapters.items import Extraction, SparseWeights
from sie_worker.batching.stats import BatchStats
from sie_worker.engine.postprocess import Quantized

# Longest item id an error message or ErrorInfo echoes (ids are echoed whole in answers only).
SHOWN_ID_CHARS = 128


@dataclass(frozen=True)
class ImageInput:
    """One encoded image as the caller sent it; `format` is the caller's hint ("" when none)."""

    data: bytes
    format: str = ""


class ItemInput(NamedTuple):
    """One item: text, images, or both (which of them a model takes is checked against its `inputs`).

    A NamedTuple: requests carry hundreds of items, and tuples build several times faster than dataclasses."""

    text: str | None = None
    images: tuple[ImageInput, ...] = ()
    id: str = ""
    # Position in the request's items; None for a score request's query.
    position: int | None = None

    @property
    def modality(self) -> str:
        """The tower of a dual encoder that reads the item: "image" when it has images, else "text"."""
        return "image" if self.images else "text"

    @property
    def label(self) -> str:
        """How error messages name the item: "items[3] (id 'cat')", or "query"."""
        where = "query" if self.position is None else f"items[{self.position}]"
        return f"{where} (id {self.shown_id!r})" if self.id else where

    @property
    def metadata(self) -> dict[str, str]:
        """ErrorInfo metadata naming the item: `item` (its index, or "query") and `item_id` when it has one."""
        named = {"item": "query" if self.position is None else str(self.position)}
        return {**named, "item_id": self.shown_id} if self.id else named

    @property
    def shown_id(self) -> str:
        """The id as errors echo it: cut to SHOWN_ID_CHARS, so an error's trailer stays small whatever the id."""
        return self.id if len(self.id) <= SHOWN_ID_CHARS else self.id[:SHOWN_ID_CHARS] + "..."


@dataclass(frozen=True)
class EncodeJob:
    model: str
    items: list[ItemInput]
    # Empty: the model's default output type (ModelConfig.default_output_types).
    output_types: tuple[str, ...] = ()
    output_dtype: str = "float32"
    instruction: str | None = None
    is_query: bool = False
    dims: int | None = None
    profile: str = ""
    lora: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    # Per-batch statistics in the answer's timing (SIE_INSTRUMENTATION must be on).
    debug: bool = False


@dataclass(frozen=True)
class ScoreJob:
    model: str
    query: ItemInput
    items: list[ItemInput]
    top_k: int | None = None
    instruction: str | None = None
    profile: str = ""
    lora: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    # Per-batch statistics in the answer's timing (SIE_INSTRUMENTATION must be on).
    debug: bool = False


@dataclass(frozen=True)
class ExtractJob:
    model: str
    items: list[ItemInput]
    labels: tuple[str, ...] = ()
    threshold: float | None = None
    profile: str = ""
    lora: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    # Per-batch statistics in the answer's timing (SIE_INSTRUMENTATION must be on).
    debug: bool = False


@dataclass(frozen=True)
class Timing:
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    postprocessing_ms: float
    total_ms: float
    # The forward passes that carried the request, when it asked for debug.
    batches: tuple[BatchStats, ...] = ()


@dataclass(frozen=True)
class EncodedOutput:
    """One item's outputs after postprocessing; only the requested ones are set."""

    dense: Quantized | None = None
    sparse: SparseWeights | None = None
    multivector: Quantized | None = None


@dataclass(frozen=True)
class EncodeOutcome:
    model: str
    items: list[EncodedOutput]
    timing: Timing
    # Tokens the items took after truncation, prompts included.
    tokens: int = 0


@dataclass(frozen=True)
class ScoredItem:
    index: int
    score: float


@dataclass(frozen=True)
class ScoreOutcome:
    model: str
    ranked: list[ScoredItem]  # best first, cut to top_k
    timing: Timing
    # Tokens the model read after truncation (every pair, or the query and every item), prompts included.
    tokens: int = 0


@dataclass(frozen=True)
class ExtractOutcome:
    model: str
    results: list[Extraction]  # per item
    timing: Timing
