"""What the engine needs from a model adapter: one contract for every task.

Each item of a request goes through three steps:

    prepare (CPU: tokenize a text, process an image) -> run (the device: a batch) -> finish (CPU: the item's output)

`prepare` runs on the preprocessing threads (the texts of a request part together, each image alone on the image
pool), `run` on the device thread, under torch.inference_mode, with the prepared values of a batch whose items all
share one `Query` (sie_worker.engine.batch_key), `finish` on the preprocessing threads. `check` sees each request
once, before any work. An encoder's `run` answers an EncodedItem per item, a pair scorer's a score, an extractor's
its raw output (an Extraction once finished); a generator may answer `Continued` for an item and get it back in a
later batch.

What a family serves is declared once, in its class's `spec` (sie_worker.adapters.spec), checked when the class is
defined. Adapters raise ValueError for what a request asks that the model cannot do, and AdapterError where the
refusal has a reason of its own; a model that needs a package the worker lacks raises MissingPackage as it loads. The
engine and the registry alone turn them into the statuses callers see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from PIL import Image

from sie_common.cluster.model_config import ModelConfig, Profile
from sie_worker.adapters.items import EncodedItem
from sie_worker.adapters.spec import AdapterSpec

# How a query's and an item's embeddings compare, in a score by embeddings.
Similarity = Callable[[EncodedItem, EncodedItem], float]


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


@dataclass(frozen=True)
class Query:
    """What one part of a request asks of each of its items. Items of concurrent requests share a forward pass only
    with items of an equal query (its fields are the batch key's)."""

    # What the forward pass does: "encode" (embeddings, a score's by embeddings too), "score" (pairs), "extract".
    task: str
    # "image": the items are images (a dual encoder's image tower, a page retriever's image path).
    modality: str = "text"
    # What an encoder's forward pass computes.
    outputs: tuple[str, ...] = ()
    is_query: bool = False
    instruction: str | None = None
    labels: tuple[str, ...] = ()
    # None: the model's default.
    threshold: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


class Input(NamedTuple):
    """One item as an adapter reads it: its text, its decoded image, or both (a question about a page); for a pair
    scorer also `pair`, the text the item is scored against (the score's query)."""

    text: str | None = None
    image: Image.Image | None = None
    pair: str | None = None

    def decoded_image(self) -> Image.Image:
        """The item's image (an image part's items all have one); ValueError when it has none."""
        if self.image is None:
            raise ValueError("the item has no image")
        return self.image


class Prepared(NamedTuple):
    """One item made ready for the device, with its batching cost (tokens; an image 1, or its patches) and, for an
    encoder that counts them before the forward pass, the multivector rows `run` will return for it."""

    value: Any
    cost: int
    rows: int = 0


@dataclass(frozen=True, eq=False)
class Continued:
    """A `run` output for an item whose generation paused after a slice of decode steps, `row` of the batch state
    `state` (the adapter's: encoder outputs, KV cache, ids so far). The engine queues the item again, behind the
    batches queued meanwhile, and hands it back to `run` with the other items of its state still going."""

    state: Any
    row: int


class AdapterError(ValueError):
    """What a request asks that the model cannot do, with the reason callers are told (INVALID_ARGUMENT) and its
    ErrorInfo metadata; `item`: the position of the item at fault among those `prepare` was given."""

    def __init__(
        self, message: str, *, reason: str, metadata: Mapping[str, str] | None = None, item: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.item = item


class MissingPackage(Exception):
    """A model that cannot load in this worker because a package its family needs does not import (a load error,
    not a request's): the registry answers it as FAILED_PRECONDITION ADAPTER_DEPENDENCY_MISSING, with `metadata`,
    until the worker runs with the package."""

    def __init__(self, message: str, *, model: str, package: str) -> None:
        super().__init__(message)
        self.message = message
        self.metadata = {"model": model, "package": package}


class Adapter:
    """A loaded model, behind the one contract. A family subclasses it with its `spec`; its loaded model sets the
    attributes below."""

    spec: ClassVar[AdapterSpec]
    # The torch module LoRA adapters attach to, and the precision checks read.
    model: torch.nn.Module
    # The longest input the model reads, in tokens.
    max_sequence_length: int
    # Width of the dense output (0: none) and of each multivector row.
    dims: int = 0
    multivector_dims: int = 0
    # Whether dense output is L2-normalized (truncation renormalizes then).
    normalized: bool = False

    def __init__(self, context: LoadContext) -> None:
        """Load the model `context` describes (on a load thread; one load at a time)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A family (a class with a `spec` of its own) must declare a valid spec and implement what it declares."""
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is None:
            return
        problems = spec.problems()
        if cls.run is Adapter.run:
            problems.append("it does not implement run")
        if cls.prepare is Adapter.prepare and cls.prepare_one is Adapter.prepare_one:
            problems.append("it implements neither prepare nor prepare_one")
        if "image" in spec.inputs and cls.resized_pixels is Adapter.resized_pixels:
            problems.append("it takes images and does not say what size its processor resizes them to")
        if "extract" in spec.tasks and cls.finish is Adapter.finish:
            problems.append("it extracts and does not implement finish")
        if problems:
            raise TypeError(f"adapter {cls.__name__} ({spec.name}): {'; '.join(problems)}")

    def check(self, query: Query) -> None:
        """ValueError (or AdapterError) for options or labels this model cannot take; once per request, before any
        work. The options are known ones by then (the spec's), each within its declared bounds."""

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        """Each item made ready for the device; ValueError for an item the model cannot read (an AdapterError names
        it by `item`). Thread-safe. By default each item through `prepare_one`."""
        prepared = []
        for position, item in enumerate(items):
            try:
                prepared.append(self.prepare_one(item, query))
            except AdapterError as error:
                error.item = position if error.item is None else error.item
                raise
            except ValueError as error:
                raise AdapterError(str(error), reason="INVALID_ITEM", item=position) from None
        return prepared

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """One item made ready for the device (the default `prepare` calls it for each)."""
        raise NotImplementedError

    def run(self, batch: Sequence[Any], query: Query) -> Sequence[Any] | np.ndarray:
        """One output per prepared value of the batch. Device thread only."""
        raise NotImplementedError

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Any:
        """The item's output from its prepared value and its `run` output (by default that output). Thread-safe."""
        return output

    def resized_pixels(self, width: int, height: int) -> int:
        """Pixels the processor makes of an image of this size (before any crop): checked before it is decoded.
        Thread-safe. Adapters that take images say it."""
        raise NotImplementedError

    def scoring(self, options: Mapping[str, Any]) -> tuple[tuple[str, ...], Similarity] | None:
        """For a score by embeddings: the outputs to encode and how a query's compare with an item's, where the
        model's options pick them (BGE-M3); None for the engine's default (cosine of dense embeddings of a dual
        encoder, MaxSim of multivectors). ValueError for options that do not parse."""
        return None
