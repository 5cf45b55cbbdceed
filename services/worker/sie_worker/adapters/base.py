"""What the pipeline needs from a model adapter.

Every adapter declares what it can do (`tasks`, `output_types`) and tokenizes
on the CPU pool; the device-thread methods take a batch of tokenized items and
return numpy arrays, one entry per item. Encoders produce every requested
output type of a batch from one forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from PIL import Image

from sie_common.cluster.model_config import ModelConfig, Profile


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


@dataclass(frozen=True)
class LoadContext:
    config: ModelConfig
    profile: Profile
    weights: Path
    device: torch.device
    dtype: torch.dtype
    attention_backend: str
    # Pack float32 CPU Linear layers for oneDNN (sie_worker.kernels.onednn).
    cpu_onednn: bool
    # Let BERT-family CPU models skip padded tokens where the adapter allows it (sie_worker.kernels.unpadded).
    cpu_unpadded: bool


class ModelAdapter(Protocol):
    """What every adapter has: capabilities, limits and the module LoRA adapters attach to."""

    tasks: tuple[str, ...]
    output_types: tuple[str, ...]
    # Width of dense output (0 when the model has none).
    dims: int
    max_sequence_length: int
    # The transformer that LoRA adapters are injected into.
    model: torch.nn.Module


@runtime_checkable
class TextEncoder(ModelAdapter, Protocol):
    """A model that turns text into dense, sparse and/or multivector embeddings."""

    # True when dense output is L2-normalized (truncation renormalizes then).
    normalized: bool

    def prompt(self, *, is_query: bool, instruction: str | None) -> str:
        """The prefix put before each text for this kind of request."""

    def tokenize(self, texts: Sequence[str], prompt: str, *, is_query: bool = False) -> list[TokenizedText]:
        """Token ids, truncated to the model's maximum length. Thread-safe."""

    def encode(self, batch: Sequence[TokenizedText], output_types: Sequence[str]) -> list[EncodedItem]:
        """Every requested output of every item, from one forward pass. Device thread only."""


@runtime_checkable
class MultivectorCounter(TextEncoder, Protocol):
    """An encoder that knows from a tokenized text how many multivector rows it yields, so the size of a
    multivector answer is known before the forward pass."""

    multivector_dims: int

    def multivector_rows(self, item: TokenizedText) -> int:
        """The multivector rows `encode` returns for `item`."""


@runtime_checkable
class OptionScorer(TextEncoder, Protocol):
    """An encoder whose score request picks, by its options, which outputs are compared and how (BGE-M3)."""

    def scoring(
        self, options: Mapping[str, Any]
    ) -> tuple[tuple[str, ...], Callable[[EncodedItem, EncodedItem], float]]:
        """The outputs to encode and the similarity of the query's to an item's; ValueError for options that do not
        parse."""


@runtime_checkable
class ImageEncoder(TextEncoder, Protocol):
    """A dual encoder (CLIP-style): texts through its text tower, images through its image tower, one embedding
    space."""

    def resized_pixels(self, width: int, height: int) -> int:
        """Pixels the processor resizes an image of this size to, before any crop: checked before decoding.
        Thread-safe."""

    def prepare_image(self, image: Image.Image) -> Any:
        """Pixel values (and what else the model reads of an image) of one decoded image, resized and normalized by
        the model's processor. Thread-safe."""

    def encode_images(self, batch: Sequence[Any], output_types: Sequence[str]) -> list[EncodedItem]:
        """Every requested output of every image, from one forward pass. Device thread only."""


@runtime_checkable
class PatchImageEncoder(ImageEncoder, MultivectorCounter, Protocol):
    """An image encoder that yields one multivector per token of its processed image (ColPali, ColQwen2): their
    number, known before the forward pass, bounds the answer and is the image's cost in a batch."""

    def image_rows(self, image: Any) -> int:
        """The multivector rows `encode_images` returns for an image `prepare_image` made."""


@runtime_checkable
class PairScorer(ModelAdapter, Protocol):
    """A cross-encoder: one relevance score per (query, item) pair."""

    def tokenize_pairs(self, query: str, texts: Sequence[str], instruction: str | None = None) -> list[TokenizedText]:
        """Each (query, text) pair as one sequence, with the request's instruction where the model reads one.
        Thread-safe."""

    def score(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        """One float score per pair. Device thread only."""


@dataclass(frozen=True)
class ExtractQuery:
    """What an extract request asks of each of its items. Items batch together only with items of an equal query
    (the batch key holds the labels, the threshold and the canonical options)."""

    labels: tuple[str, ...] = ()
    # None: the model's default.
    threshold: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExtractInput:
    """One extract item as the adapter reads it: its text, its decoded image, or both (a question about a page)."""

    text: str | None = None
    image: Image.Image | None = None


@dataclass(frozen=True, eq=False)
class Continued:
    """A `run` output for an item whose generation paused after a slice of decode steps, `row` of the batch state
    `state` (the adapter's: encoder outputs, KV cache, ids so far). The pipeline queues the item again, behind the
    batches queued meanwhile, and hands it back to `run` with the other items of its state still going."""

    state: Any
    row: int


class Prepared(NamedTuple):
    """One item made ready for the device, with its batching cost (tokens; 1 for an image)."""

    value: Any
    cost: int


@runtime_checkable
class ItemExtractor(ModelAdapter, Protocol):
    """A model that extracts from each item: spans, classes, relations, objects or generated data.

    An item goes through three steps: `prepare` on a preprocessing thread, `run` on the device thread in a batch
    of items with the same query, then `finish` on a preprocessing thread."""

    # True when the request names the labels (zero-shot); it must then name at least one.
    zero_shot: bool

    def check_query(self, query: ExtractQuery) -> None:
        """ValueError for options (or labels) this model cannot take; called once per request, before any work."""

    def prepare(self, item: ExtractInput, query: ExtractQuery) -> Prepared:
        """The item tokenized or its image processed, ready to batch; ValueError for an item the model cannot read.
        Thread-safe."""

    def run(self, batch: Sequence[Any], query: ExtractQuery) -> list[Any]:
        """The model's raw output for each prepared value of the batch (a generator may answer `Continued` for an
        item and get its `Continued` back in a later batch). Device thread only."""

    def finish(self, item: ExtractInput, prepared: Any, output: Any, query: ExtractQuery) -> Extraction:
        """One item's results from its prepared value and raw output. Thread-safe."""


@runtime_checkable
class ImageExtractor(ItemExtractor, Protocol):
    """An extractor that reads images (detectors, document readers)."""

    def resized_pixels(self, width: int, height: int) -> int:
        """Pixels the processor resizes an image of this size to: checked before decoding. Thread-safe."""
