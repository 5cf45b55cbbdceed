"""Validated requests (jobs) and what the engine answers them with (outcomes)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sie_worker.adapters.base import Entity, SparseWeights
from sie_worker.batch_stats import BatchStats
from sie_worker.postprocess import Quantized


@dataclass(frozen=True)
class EncodeJob:
    model: str
    texts: list[str]
    output_types: tuple[str, ...] = ("dense",)
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
    query: str
    texts: list[str]
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
    texts: list[str]
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


@dataclass(frozen=True)
class ExtractOutcome:
    model: str
    entities: list[list[Entity]]  # per item
    timing: Timing


def canonical_options(options: Mapping[str, Any]) -> str:
    """Options as canonical JSON: equal options give equal batch keys."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"), default=str)
