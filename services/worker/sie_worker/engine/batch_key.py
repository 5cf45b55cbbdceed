"""What lets items of concurrent requests share a forward pass: their BatchKey, the BatchFormer's group key, made in
one place from a part's model, LoRA and query."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from sie_worker.adapters.contract import Query


class BatchKey(NamedTuple):
    """Items share a forward pass only when every field agrees. A NamedTuple: one is built per request part, and it
    hashes as fast as the tuple it is."""

    model: str
    profile: str
    task: str  # "encode" (embeddings, a score's too), "score" (pairs) or "extract"
    lora: str
    options: str  # the run-time options as canonical JSON (`canonical_options`)
    # "image" for a dual encoder's image items, which go through the image tower in batches of their own.
    modality: str = "text"
    outputs: tuple[str, ...] = ()  # what the forward pass computes
    instruction: str | None = None
    is_query: bool = False
    labels: tuple[str, ...] = ()  # extract
    threshold: float | None = None  # extract


def batch_key(model: str, profile: str, lora: str, query: Query) -> BatchKey:
    """The key of the items of `model` (its `profile`) with `lora` that ask `query`."""
    return BatchKey(
        model,
        profile,
        query.task,
        lora,
        canonical_options(query.options),
        query.modality,
        query.outputs,
        query.instruction,
        query.is_query,
        query.labels,
        query.threshold,
    )


def canonical_options(options: Mapping[str, Any]) -> str:
    """Options as canonical JSON: equal options give equal batch keys."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"), default=str)
